//! Marked remote commands against a real OpenSSH server on 127.0.0.1 (feature `ssh`).
//!
//! The ground truth of every duplicate test is the file the command appends to: one line per
//! time the command really ran on the host.

use crate::sshd;

use std::{path::Path, time::Duration};

use mcp_replay_guard::{
    ExecutionId,
    contract::ProbeOutcome,
    fingerprint::Channel,
    integrations::ssh::{
        HostKeyPin, MarkedCommand, MarkerProbe, MarkerRecord, MarkerStatus, SshError, read_marker,
        run_marked,
    },
};
use sshd::{
    Forwarder, SECOND_ACCOUNT, Sshd, account, fingerprint_of, ids_of, second_account_or_skip,
    sshd_or_skip,
};

fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |s| s.lines().count())
}

/// A command that appends one line to `<dir>/f` (after `delay`), under markers in `<dir>/markers`.
fn append(sshd: &Sshd, delay: &str) -> (MarkedCommand, std::path::PathBuf) {
    let file = sshd.dir.join("f");
    let cmd = format!("{delay}echo x >> '{}'", file.display());
    let command = MarkedCommand::new(cmd)
        .cwd(sshd.dir.display().to_string())
        .state_dir(sshd.dir.join("markers").display().to_string());
    (command, file)
}

fn probe(sshd: &Sshd) -> MarkerProbe {
    MarkerProbe::new(sshd.config()).state_dir(sshd.dir.join("markers").display().to_string())
}

/// What a probe of the markers in `state_dir` reads for `id`.
async fn probe_outcome_in(sshd: &Sshd, state_dir: &str, id: ExecutionId) -> ProbeOutcome {
    MarkerProbe::new(sshd.config())
        .state_dir(state_dir)
        .status(id)
        .await
        .unwrap()
        .to_probe_outcome()
}

/// Read the marker until `done` holds (bounded: 15 s).
async fn wait_for(
    probe: &MarkerProbe,
    id: ExecutionId,
    done: impl Fn(&MarkerStatus) -> bool,
) -> MarkerStatus {
    for _ in 0..150 {
        let status = probe.status(id).await.unwrap();
        if done(&status) {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the marker of {id} never reached the expected state");
}

/// What a repeat of the call does: probe first, and send only on "not applied".
async fn repeat(sshd: &Sshd, id: ExecutionId, command: &MarkedCommand) -> ProbeOutcome {
    let outcome = probe(sshd).status(id).await.unwrap().to_probe_outcome();
    if outcome == ProbeOutcome::NotApplied {
        let session = sshd.config().connect().await.unwrap();
        run_marked(&session, id, command).await.unwrap();
    }
    // Even a blind re-send is refused by the marker.
    let session = sshd.config().connect().await.unwrap();
    let again = run_marked(&session, id, command).await.unwrap_err();
    assert!(
        again.is_already_started() && again.is_not_started(),
        "{again}"
    );
    outcome
}

#[tokio::test]
async fn a_marked_command_runs_once_and_its_repeat_reads_the_marker() {
    let Some(()) = sshd_or_skip() else { return };
    let sshd = Sshd::start("once").await;
    let (command, file) = append(&sshd, "");
    let id = ExecutionId::new();
    let session = sshd.config().connect().await.unwrap();
    let record = run_marked(&session, id, &command).await.unwrap();
    assert_eq!(record.exit_status, 0);
    assert_eq!(lines(&file), 1);

    let outcome = repeat(&sshd, id, &command).await;
    let ProbeOutcome::Applied {
        result: Some(result),
    } = outcome
    else {
        panic!("{outcome:?}")
    };
    assert_eq!(result["isError"], false);
    assert_eq!(result["structuredContent"]["exit_status"], 0);
    assert_eq!(lines(&file), 1);
    // The marker holds what the module docs say.
    let marker = sshd.dir.join("markers").join(id.to_string());
    for part in ["started", "child", "command", "exit", "stdout", "stderr"] {
        assert!(marker.join(part).is_file(), "{part} missing");
    }
}

/// Starts `command` under a new execution through a TCP forwarder that the test can mute or
/// cut (what a killed client or a dead network does to the connection), and waits until the
/// marker says it runs. `keepalive`: the client's, when the test needs a short one.
async fn run_through_forwarder(
    sshd: &Sshd,
    command: &MarkedCommand,
    keepalive: Option<Duration>,
) -> (
    ExecutionId,
    Forwarder,
    tokio::task::JoinHandle<Result<MarkerRecord, SshError>>,
    MarkerProbe,
) {
    let id = ExecutionId::new();
    let forwarder = Forwarder::start(sshd.port).await;
    let mut config = sshd.config_on(
        forwarder.port,
        HostKeyPin::fingerprint(&sshd.host_fingerprint),
    );
    if let Some(interval) = keepalive {
        config = config.keepalive(interval);
    }
    let cmd = command.clone();
    let first = tokio::spawn(async move {
        let session = config.connect().await.unwrap();
        run_marked(&session, id, &cmd).await
    });
    let probe = probe(sshd);
    wait_for(&probe, id, |s| matches!(s, MarkerStatus::Running { .. })).await;
    (id, forwarder, first, probe)
}

#[tokio::test]
async fn a_connection_cut_while_the_command_runs_leaves_one_line() {
    let Some(()) = sshd_or_skip() else { return };
    let sshd = Sshd::start("cut-running").await;
    let (command, file) = append(&sshd, "sleep 2; ");
    let (id, forwarder, first, probe) = run_through_forwarder(&sshd, &command, None).await;
    forwarder.cut();
    let err = first.await.unwrap().unwrap_err();
    assert!(err.is_outcome_unknown() && !err.is_not_started(), "{err}");

    // Right after the cut the command is still running on the host: in progress, not re-sent.
    assert_eq!(
        probe.status(id).await.unwrap().to_probe_outcome(),
        ProbeOutcome::InProgress
    );
    assert_eq!(lines(&file), 0);
    wait_for(&probe, id, |s| matches!(s, MarkerStatus::Exited(_))).await;
    assert!(matches!(
        repeat(&sshd, id, &command).await,
        ProbeOutcome::Applied { .. }
    ));
    assert_eq!(lines(&file), 1);
}

#[tokio::test]
async fn a_connection_cut_after_the_command_finished_leaves_one_line() {
    let Some(()) = sshd_or_skip() else { return };
    let sshd = Sshd::start("cut-finished").await;
    let (command, file) = append(&sshd, "sleep 1; ");
    let (id, forwarder, first, probe) = run_through_forwarder(&sshd, &command, None).await;
    // The host's answer is lost from here on; the command finishes; then the connection dies.
    forwarder.mute();
    wait_for(&probe, id, |s| matches!(s, MarkerStatus::Exited(_))).await;
    forwarder.cut();
    let err = first.await.unwrap().unwrap_err();
    assert!(err.is_outcome_unknown(), "{err}");
    assert_eq!(lines(&file), 1);

    assert!(matches!(
        repeat(&sshd, id, &command).await,
        ProbeOutcome::Applied { .. }
    ));
    assert_eq!(lines(&file), 1);
}

#[tokio::test]
async fn a_killed_command_whose_process_is_gone_needs_review() {
    let Some(()) = sshd_or_skip() else { return };
    let sshd = Sshd::start("killed").await;
    let (command, file) = append(&sshd, "sleep 30; ");
    let id = ExecutionId::new();
    let config = sshd.config();
    let cmd = command.clone();
    let first = tokio::spawn(async move {
        let session = config.connect().await.unwrap();
        run_marked(&session, id, &cmd).await
    });
    let probe = probe(&sshd);
    let status = wait_for(&probe, id, |s| {
        matches!(s, MarkerStatus::Running { child: Some(_), .. })
    })
    .await;
    let MarkerStatus::Running {
        pid: Some(pid),
        child: Some(child),
    } = status
    else {
        panic!("{status:?}")
    };
    for pid in [pid, child] {
        let killed = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
    }
    let err = first.await.unwrap().unwrap_err();
    assert!(err.is_outcome_unknown(), "{err}");

    let status = wait_for(&probe, id, |s| !matches!(s, MarkerStatus::Running { .. })).await;
    assert!(matches!(status, MarkerStatus::Gone { .. }), "{status:?}");
    let outcome = status.to_probe_outcome();
    assert!(
        matches!(outcome, ProbeOutcome::Unknown { .. }),
        "{outcome:?}"
    );
    // Unknown is not "not applied": a repeat is still refused by the marker.
    let session = sshd.config().connect().await.unwrap();
    assert!(
        run_marked(&session, id, &command)
            .await
            .unwrap_err()
            .is_already_started()
    );
    assert_eq!(lines(&file), 0);
}

#[tokio::test]
async fn two_concurrent_runs_of_one_execution_start_the_command_once() {
    let Some(()) = sshd_or_skip() else { return };
    let sshd = Sshd::start("concurrent").await;
    let (command, file) = append(&sshd, "sleep 1; ");
    let id = ExecutionId::new();
    let (a, b) = (
        sshd.config().connect().await.unwrap(),
        sshd.config().connect().await.unwrap(),
    );
    let (ra, rb) = tokio::join!(run_marked(&a, id, &command), run_marked(&b, id, &command));
    let (ok, refused): (Vec<_>, Vec<_>) = [ra, rb].into_iter().partition(Result::is_ok);
    assert_eq!(ok.len(), 1, "{refused:?}");
    assert!(refused[0].as_ref().unwrap_err().is_already_started());
    assert_eq!(lines(&file), 1);
}

#[tokio::test]
async fn an_unwritable_state_dir_is_a_clear_error_and_nothing_runs() {
    let Some(()) = sshd_or_skip() else { return };
    let sshd = Sshd::start("unwritable").await;
    // A regular file where a directory should be: even root cannot create the state dir.
    let blocker = sshd.dir.join("not-a-dir");
    std::fs::write(&blocker, "").unwrap();
    let flag = sshd.dir.join("ran");
    let command = MarkedCommand::new(format!("touch '{}'", flag.display()))
        .state_dir(blocker.join("markers").display().to_string());
    let session = sshd.config().connect().await.unwrap();
    let err = run_marked(&session, ExecutionId::new(), &command)
        .await
        .unwrap_err();
    assert!(
        err.is_state_dir_unwritable() && err.is_not_started(),
        "{err}"
    );
    assert!(err.to_string().contains("not writable"), "{err}");
    assert!(!flag.exists());
}

#[tokio::test]
async fn a_host_key_mismatch_is_an_error_before_anything_runs() {
    let Some(()) = sshd_or_skip() else { return };
    let sshd = Sshd::start("mismatch").await;
    let other = sshd.dir.join("other_key");
    let status = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other)
        .status()
        .unwrap();
    assert!(status.success());
    let other_pub = sshd.dir.join("other_key.pub");
    let known_hosts = sshd.dir.join("known_hosts");
    let other_line = std::fs::read_to_string(&other_pub).unwrap();
    std::fs::write(
        &known_hosts,
        format!("[127.0.0.1]:{} {other_line}", sshd.port),
    )
    .unwrap();
    for pin in [
        HostKeyPin::fingerprint(fingerprint_of(&other_pub)),
        HostKeyPin::openssh_public_key(&other_line).unwrap(),
        HostKeyPin::known_hosts(&known_hosts),
    ] {
        let err = sshd.config_on(sshd.port, pin).connect().await.unwrap_err();
        assert!(err.is_host_key_mismatch() && err.is_not_started(), "{err}");
        assert!(err.to_string().contains(&sshd.host_fingerprint), "{err}");
    }
    // Nothing authenticated, so nothing ran: sshd saw no accepted key.
    assert!(!sshd.log().contains("Accepted publickey"), "{}", sshd.log());

    // The right key, by each kind of pin, is accepted.
    std::fs::write(
        &known_hosts,
        format!("[127.0.0.1]:{} {}", sshd.port, sshd.host_public_key),
    )
    .unwrap();
    for pin in [
        HostKeyPin::openssh_public_key(&sshd.host_public_key).unwrap(),
        HostKeyPin::known_hosts(&known_hosts),
    ] {
        let session = sshd.config_on(sshd.port, pin).connect().await.unwrap();
        assert_eq!(session.host_fingerprint(), sshd.host_fingerprint);
    }
}

#[tokio::test]
async fn the_action_channel_names_the_host_key_account_command_and_directory() {
    let Some(()) = sshd_or_skip() else { return };
    let sshd = Sshd::start("channel").await;
    let session = sshd.config().connect().await.unwrap();
    let command = MarkedCommand::new("systemctl restart x").cwd("/srv");
    let Channel::Ssh {
        host_identity,
        account: who,
        command: line,
        working_directory,
    } = session.channel(&command)
    else {
        panic!("not an ssh channel")
    };
    assert!(host_identity.starts_with("SHA256:"));
    assert_eq!(host_identity, sshd.host_fingerprint);
    assert_eq!(who, account());
    assert_eq!(line, "systemctl restart x");
    assert_eq!(working_directory.as_deref(), Some("/srv"));
    // And reading a marker that does not exist says "not applied".
    let status = read_marker(&session, ExecutionId::new(), None)
        .await
        .unwrap();
    assert_eq!(status.to_probe_outcome(), ProbeOutcome::NotApplied);
}

#[tokio::test]
async fn a_host_gone_silent_ends_the_run_as_unknown_by_keepalive() {
    let Some(()) = sshd_or_skip() else { return };
    let sshd = Sshd::start("silent").await;
    let (command, file) = append(&sshd, "sleep 1; ");
    let (id, forwarder, first, probe) =
        run_through_forwarder(&sshd, &command, Some(Duration::from_millis(200))).await;
    // No reset, no close: the host just stops answering.
    forwarder.mute();
    let err = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the keepalive ends the wait")
        .unwrap()
        .unwrap_err();
    assert!(err.is_outcome_unknown(), "{err}");
    wait_for(&probe, id, |s| matches!(s, MarkerStatus::Exited(_))).await;
    assert!(matches!(
        repeat(&sshd, id, &command).await,
        ProbeOutcome::Applied { .. }
    ));
    assert_eq!(lines(&file), 1);
}

/// Makes `dir` the second account's (`Some((uid, gid))`) or leaves it the login account's, with
/// `mode`.
fn hand_over(dir: &Path, owner: Option<(u32, u32)>, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).unwrap();
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The second account, checked to be another account than the one sshd logs the tests in as
/// (root included: root can read any directory, so ownership must decide, not access).
fn another_account() -> Option<(u32, u32)> {
    let other = second_account_or_skip()?;
    let login = ids_of(&account()).expect("the login account's uid");
    assert_ne!(other.0, login.0, "{SECOND_ACCOUNT} is the login account");
    Some(other)
}

#[tokio::test]
async fn a_state_dir_the_account_does_not_control_reads_unknown_and_runs_nothing() {
    let Some(()) = sshd_or_skip() else { return };
    let Some(other) = another_account() else {
        return;
    };
    let sshd = Sshd::start("uncontrolled").await;
    let file = sshd.dir.join("f");
    // (directory, owner, mode, a state dir made in it is refused too): each is a directory where
    // a marker could vanish after its command ran (renamed by another account, or unreadable),
    // so "no marker" proves nothing. A state dir made in a sticky directory of the login
    // account's is its own, and no other account can move it: allowed.
    let cases = [
        ("shared-by-another-account", Some(other), 0o1777, true),
        ("owned-by-another-account", Some(other), 0o700, true),
        ("shared-sticky", None, 0o1777, false),
        ("group-writable", None, 0o770, true),
        ("unreadable", None, 0o000, true),
    ];
    for (name, owner, mode, below_refused) in cases {
        let dir = sshd.dir.join(name);
        std::fs::create_dir(&dir).unwrap();
        hand_over(&dir, owner, mode);
        let state = dir.display().to_string();
        let command =
            MarkedCommand::new(format!("echo {name} >> '{}'", file.display())).state_dir(&state);
        let id = ExecutionId::new();

        let session = sshd.config().connect().await.unwrap();
        let err = run_marked(&session, id, &command)
            .await
            .expect_err("a run in a state dir the account does not control");
        assert!(
            err.is_not_started() && err.to_string().contains("sole control"),
            "{name}: {err}"
        );
        let outcome = probe_outcome_in(&sshd, &state, id).await;
        assert!(
            matches!(outcome, ProbeOutcome::Unknown { .. }),
            "{name}: {outcome:?}"
        );
        if !below_refused {
            continue;
        }
        // A state dir to be made under such a directory is refused and reads unknown too.
        let below = format!("{state}/markers");
        let err = run_marked(&session, id, &command.clone().state_dir(&below))
            .await
            .expect_err("a run below a directory the account does not control");
        assert!(err.is_not_started(), "{name}/markers: {err}");
        let outcome = probe_outcome_in(&sshd, &below, id).await;
        assert!(
            matches!(outcome, ProbeOutcome::Unknown { .. }),
            "{name}/markers: {outcome:?}"
        );
    }
    assert_eq!(lines(&file), 0, "a command ran");
}

#[tokio::test]
async fn a_marker_another_account_moved_away_never_reads_not_applied() {
    let Some(()) = sshd_or_skip() else { return };
    let Some(other) = another_account() else {
        return;
    };
    let sshd = Sshd::start("moved-away").await;
    let shared = sshd.dir.join("shared");
    std::fs::create_dir(&shared).unwrap();
    let state = shared.join("markers");
    let file = sshd.dir.join("f");
    let command = MarkedCommand::new(format!("echo x >> '{}'", file.display()))
        .state_dir(state.display().to_string());
    let probe = MarkerProbe::new(sshd.config()).state_dir(state.display().to_string());
    // Two commands ran under their markers.
    let (marker_moved, dir_moved) = (ExecutionId::new(), ExecutionId::new());
    for id in [marker_moved, dir_moved] {
        let session = sshd.config().connect().await.unwrap();
        run_marked(&session, id, &command).await.unwrap();
    }
    assert_eq!(lines(&file), 2);

    // Then another account holds the directories, shared (mode 1777), and moves a marker away;
    // what a repeat does next: probe, and re-send only on "not applied".
    hand_over(&shared, Some(other), 0o1777);
    hand_over(&state, Some(other), 0o1777);
    std::fs::rename(
        state.join(marker_moved.to_string()),
        shared.join("elsewhere"),
    )
    .unwrap();
    let repeat = async |id: ExecutionId| {
        let outcome = probe.status(id).await.unwrap().to_probe_outcome();
        if outcome == ProbeOutcome::NotApplied {
            let session = sshd.config().connect().await.unwrap();
            let _ = run_marked(&session, id, &command).await;
        }
        outcome
    };
    let outcome = repeat(marker_moved).await;
    assert_eq!(lines(&file), 2, "the command ran again: {outcome:?}");
    assert!(
        matches!(outcome, ProbeOutcome::Unknown { .. }),
        "{outcome:?}"
    );

    // The whole state directory moved away by the owner of its parent.
    std::fs::rename(&state, shared.join("elsewhere-too")).unwrap();
    let outcome = repeat(dir_moved).await;
    assert_eq!(lines(&file), 2, "the command ran again: {outcome:?}");
    assert!(
        matches!(outcome, ProbeOutcome::Unknown { .. }),
        "{outcome:?}"
    );
}
