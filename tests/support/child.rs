//! Child processes: a test binary runs itself again to execute its `child_entry` test, which
//! reads its task from [`CHILD_TASK`] and does nothing when the variable is unset. The entry is
//! marked ignored, so a normal run does not count it as a test; the child runs it with
//! `--ignored`.

use std::process::{Command, Stdio};

/// The environment variable that carries a child's task.
pub const CHILD_TASK: &str = "MRG_CHILD";

/// This test binary again, running only `child_entry` with `task` (stdout piped, stderr
/// inherited so a child's panic shows in the parent's output).
pub fn child_process(task: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command
        .args([
            "child_entry",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_TASK, task)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    command
}

/// Asserts that a child run with [`child_process`] ran its entry and that it passed: a child
/// whose filter matched no test exits 0 too, having checked nothing.
pub fn assert_child_ran(output: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("test result: ok. 1 passed"),
        "the child did not run its task to a pass: {output:?}"
    );
}
