//! Every test against a real PostgreSQL server, in one binary: the ledger, its faults (a
//! COMMIT cut or its answer lost), its fingerprint key, kept results and tamper evidence.
//!
//! The server comes from `MCP_REPLAY_GUARD_POSTGRES_URL` (for example
//! `postgres://postgres@127.0.0.1:5432/mrg_dev` after `CREATE DATABASE mrg_dev`). Unset, every
//! test here is reported as ignored, with the reason printed first; under CI (`CI` set) they
//! run and fail loudly instead. Each test works in a schema of its own, dropped when it passes,
//! so the tests run in parallel in one database.
//!
//! `MCP_REPLAY_GUARD_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/mrg_dev cargo test --features postgres --test postgres`

use mcp_replay_guard_test_support as support;

#[path = "postgres/audit_postgres.rs"]
mod audit_postgres;
#[path = "postgres/postgres_faults.rs"]
mod postgres_faults;
#[path = "postgres/postgres_key.rs"]
mod postgres_key;
#[path = "postgres/postgres_ledger.rs"]
mod postgres_ledger;
#[path = "postgres/postgres_results.rs"]
mod postgres_results;

use std::{future::Future, process::ExitCode};

use libtest_mimic::{Arguments, Failed, Trial};

/// The runtime a test runs on (what `#[tokio::test]` would have built).
#[derive(Clone, Copy)]
enum Runtime {
    CurrentThread,
    MultiThread(usize),
}

/// A test that runs `test` on a runtime of its own; a panic is its failure.
fn trial<F>(name: &str, runtime: Runtime, test: fn() -> F) -> Trial
where
    F: Future<Output = ()> + 'static,
{
    Trial::test(name, move || {
        let runtime = match runtime {
            Runtime::CurrentThread => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build(),
            Runtime::MultiThread(workers) => tokio::runtime::Builder::new_multi_thread()
                .worker_threads(workers)
                .enable_all()
                .build(),
        }
        .map_err(|e| Failed::from(format!("a tokio runtime: {e}")))?;
        runtime.block_on(test());
        Ok(())
    })
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let trials = vec![
        trial("postgres_ledger::the_lifecycle_reads_as_the_design_record_and_survives_a_restart", Runtime::CurrentThread, postgres_ledger::the_lifecycle_reads_as_the_design_record_and_survives_a_restart),
        trial("postgres_ledger::two_replicas_racing_500_claims_of_one_intent_have_one_winner_and_one_chain", Runtime::MultiThread(4), postgres_ledger::two_replicas_racing_500_claims_of_one_intent_have_one_winner_and_one_chain),
        trial("postgres_ledger::transitions_the_state_machine_refuses_write_nothing", Runtime::CurrentThread, postgres_ledger::transitions_the_state_machine_refuses_write_nothing),
        trial("postgres_ledger::an_edited_or_deleted_event_row_is_named_by_its_seq", Runtime::CurrentThread, postgres_ledger::an_edited_or_deleted_event_row_is_named_by_its_seq),
        trial("postgres_ledger::settled_links_end_with_the_window_and_purged_records_leave_the_index_not_the_chain", Runtime::CurrentThread, postgres_ledger::settled_links_end_with_the_window_and_purged_records_leave_the_index_not_the_chain),
        trial("postgres_ledger::an_owner_is_alive_while_its_ledger_runs_and_dead_once_dropped", Runtime::MultiThread(2), postgres_ledger::an_owner_is_alive_while_its_ledger_runs_and_dead_once_dropped),
        trial("postgres_ledger::replicas_connecting_together_migrate_once", Runtime::MultiThread(2), postgres_ledger::replicas_connecting_together_migrate_once),
        trial("postgres_ledger::errors_and_debug_output_never_show_the_password", Runtime::CurrentThread, postgres_ledger::errors_and_debug_output_never_show_the_password),
        trial("postgres_ledger::a_lost_response_on_an_irreversible_tool_is_recorded_for_review_in_postgres", Runtime::CurrentThread, postgres_ledger::a_lost_response_on_an_irreversible_tool_is_recorded_for_review_in_postgres),
        trial("postgres_ledger::a_continuation_moves_the_owner_and_its_lease_with_it", Runtime::MultiThread(2), postgres_ledger::a_continuation_moves_the_owner_and_its_lease_with_it),
        trial("postgres_ledger::the_owner_of_an_earlier_attempt_in_doubt_holds_retention", Runtime::MultiThread(2), postgres_ledger::the_owner_of_an_earlier_attempt_in_doubt_holds_retention),
        trial("postgres_ledger::two_replicas_racing_on_one_intent_create_exactly_one_execution_in_many_partitions", Runtime::MultiThread(4), postgres_ledger::two_replicas_racing_on_one_intent_create_exactly_one_execution_in_many_partitions),
        trial("postgres_ledger::verify_names_an_edited_or_deleted_row_in_a_chain_other_than_the_first", Runtime::CurrentThread, postgres_ledger::verify_names_an_edited_or_deleted_row_in_a_chain_other_than_the_first),
        trial("postgres_ledger::a_line_sealed_after_a_line_that_already_has_a_successor_is_a_fork", Runtime::CurrentThread, postgres_ledger::a_line_sealed_after_a_line_that_already_has_a_successor_is_a_fork),
        trial("postgres_ledger::a_locked_chain_holds_up_a_claim_of_its_partition_not_one_of_another", Runtime::MultiThread(2), postgres_ledger::a_locked_chain_holds_up_a_claim_of_its_partition_not_one_of_another),
        trial("postgres_ledger::a_ledger_made_before_partitions_opens_verifies_and_goes_on", Runtime::CurrentThread, postgres_ledger::a_ledger_made_before_partitions_opens_verifies_and_goes_on),
        trial("postgres_ledger::a_chain_whose_last_line_was_cut_does_not_verify", Runtime::CurrentThread, postgres_ledger::a_chain_whose_last_line_was_cut_does_not_verify),
        trial("postgres_ledger::a_claim_with_its_dispatch_is_one_write_and_one_winner_across_replicas", Runtime::MultiThread(4), postgres_ledger::a_claim_with_its_dispatch_is_one_write_and_one_winner_across_replicas),
        trial("postgres_faults::a_lost_commit_answer_on_batched_claims_runs_each_call_once", Runtime::MultiThread(2), postgres_faults::a_lost_commit_answer_on_batched_claims_runs_each_call_once),
        trial("postgres_faults::a_completed_whose_commit_was_cut_is_written_again_before_the_caller_reads_on", Runtime::MultiThread(2), postgres_faults::a_completed_whose_commit_was_cut_is_written_again_before_the_caller_reads_on),
        trial("postgres_faults::a_completed_whose_commit_answer_was_lost_is_recorded_once", Runtime::MultiThread(2), postgres_faults::a_completed_whose_commit_answer_was_lost_is_recorded_once),
        trial("postgres_faults::a_claim_that_loses_its_commit_answer_still_attaches_to_the_other_replicas_call", Runtime::MultiThread(2), postgres_faults::a_claim_that_loses_its_commit_answer_still_attaches_to_the_other_replicas_call),
        trial("postgres_faults::a_claim_given_up_after_its_answer_was_lost_is_not_sent_and_its_repeat_runs_once", Runtime::MultiThread(2), postgres_faults::a_claim_given_up_after_its_answer_was_lost_is_not_sent_and_its_repeat_runs_once),
        trial("postgres_faults::a_resend_whose_dispatch_lost_its_commit_answer_is_sent_by_the_same_call", Runtime::MultiThread(2), postgres_faults::a_resend_whose_dispatch_lost_its_commit_answer_is_sent_by_the_same_call),
        trial("postgres_key::the_first_key_bound_is_the_ledgers_on_every_replica_and_after_a_restart", Runtime::CurrentThread, postgres_key::the_first_key_bound_is_the_ledgers_on_every_replica_and_after_a_restart),
        trial("postgres_key::binders_racing_with_different_keys_bind_exactly_one", Runtime::MultiThread(4), postgres_key::binders_racing_with_different_keys_bind_exactly_one),
        trial("postgres_results::a_result_stored_before_a_purge_loads_after_its_completion", Runtime::CurrentThread, postgres_results::a_result_stored_before_a_purge_loads_after_its_completion),
        trial("postgres_results::a_completed_and_its_result_are_one_write_or_neither", Runtime::CurrentThread, postgres_results::a_completed_and_its_result_are_one_write_or_neither),
        trial("audit_postgres::a_stored_line_with_an_extra_field_is_edited", Runtime::CurrentThread, audit_postgres::a_stored_line_with_an_extra_field_is_edited),
        trial("audit_postgres::a_chain_that_starts_at_a_forged_checkpoint_is_refused", Runtime::CurrentThread, audit_postgres::a_chain_that_starts_at_a_forged_checkpoint_is_refused),
        trial("audit_postgres::the_head_is_logged_on_connect_and_every_thousand_lines", Runtime::MultiThread(2), audit_postgres::the_head_is_logged_on_connect_and_every_thousand_lines),
        trial(
            "postgres_ledger::a_dispatched_execution_whose_owner_is_gone_reads_unknown_from_another_replica",
            Runtime::MultiThread(2),
            postgres_ledger::a_dispatched_execution_whose_owner_is_gone_reads_unknown_from_another_replica,
        ),
        trial(
            "postgres_ledger::a_postgres_failure_keeps_its_source",
            Runtime::CurrentThread,
            postgres_ledger::a_postgres_failure_keeps_its_source,
        ),
    ];
    let missing =
        std::env::var(support::POSTGRES_URL_VAR).map_or(true, |url| url.trim().is_empty());
    let trials = if missing && std::env::var_os("CI").is_none() {
        println!(
            "skipped: {} PostgreSQL tests, reported as ignored: {} is not set (for example \
             {}=postgres://postgres@127.0.0.1:5432/mrg_dev after CREATE DATABASE mrg_dev)",
            trials.len(),
            support::POSTGRES_URL_VAR,
            support::POSTGRES_URL_VAR,
        );
        trials
            .into_iter()
            .map(|t| t.with_ignored_flag(true))
            .collect()
    } else {
        trials
    };
    libtest_mimic::run(&args, trials).exit_code()
}
