//! Resetting CNI state on a real tree.

use hostnode::HostRoot;

#[test]
fn cni_reset_empties_the_config_dir_and_removes_state() {
    let tmp = tempfile::tempdir().unwrap();
    let root = HostRoot::new(tmp.path());
    let conf = root.cni_config_dir();
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(conf.join("10-flannel.conflist"), b"{}").unwrap();
    // An add-on's file: it goes too (its DaemonSet writes it again).
    std::fs::write(conf.join("00-multus.conf"), b"{}").unwrap();
    std::fs::create_dir_all(conf.join("multus.d")).unwrap();
    std::fs::write(conf.join("multus.d/kubeconfig"), b"x").unwrap();
    let state = root.cni_state_dir();
    std::fs::create_dir_all(state.join("networks/cbr0")).unwrap();
    std::fs::write(state.join("networks/cbr0/10.244.1.7"), b"container-id").unwrap();
    // Outside the tree: must survive even though a symlink points at it.
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("keep"), b"k").unwrap();
    std::os::unix::fs::symlink(&outside, state.join("networks/link")).unwrap();

    hostnode::reset_cni_state(&root, None).unwrap();

    assert!(conf.is_dir());
    assert_eq!(std::fs::read_dir(&conf).unwrap().count(), 0);
    assert!(!state.exists());
    assert_eq!(std::fs::read(outside.join("keep")).unwrap(), b"k");
    // Idempotent: a second reset finds nothing to do.
    hostnode::reset_cni_state(&root, None).unwrap();
    assert!(conf.is_dir());
}

#[tokio::test]
async fn host_runner_substitutes_programs_and_names_failures() {
    use hostnode::runner::{Cmd, HostRunner, RunError, Runner};
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let fake = tmp.path().join("fake-systemctl");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho \"called with $*\"\necho 'Unit kubelet.service not found.' >&2\nexit 5\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let runner = HostRunner::new().with_program("systemctl", &fake);

    let cmd = Cmd::new("systemctl", ["restart", "kubelet.service"]);
    let out = runner.output(&cmd).await.unwrap();
    assert_eq!(out.code, Some(5));
    assert_eq!(out.stdout, "called with restart kubelet.service\n");
    let err = runner.run(&cmd).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "`systemctl restart kubelet.service` failed (exit status 5): Unit kubelet.service not found."
    );

    let missing = Cmd::new("/nonexistent/ip", ["link"]);
    let err = HostRunner::new().run(&missing).await.unwrap_err();
    assert!(matches!(err, RunError::Spawn { .. }), "{err}");
    assert_eq!(
        hostnode::error_chain(&err),
        "cannot run `/nonexistent/ip link`: No such file or directory (os error 2)"
    );
}

/// Issue 17: host commands run with a deadline; a hung one is killed and the error names
/// it, instead of the agent hanging with it.
#[tokio::test]
async fn a_hung_host_command_times_out_and_is_killed() {
    use hostnode::runner::{Cmd, HostRunner, RunError, Runner};
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    let pidfile = tmp.path().join("pid");
    let fake = tmp.path().join("hung-systemctl");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho $$ > {}\nexec sleep 600\n",
            pidfile.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let runner = HostRunner::new()
        .with_program("systemctl", &fake)
        .with_timeout(Duration::from_millis(500));
    let err = runner
        .run(&Cmd::new("systemctl", ["stop", "--", "kubelet.service"]))
        .await
        .unwrap_err();
    assert!(matches!(err, RunError::TimedOut { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("systemctl stop -- kubelet.service"),
        "{err}"
    );
    // The process was killed, not left behind.
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting for its reaper.
        if state.is_empty() || state.split(' ').nth(2) == Some("Z") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the timed-out command still runs: {state}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
