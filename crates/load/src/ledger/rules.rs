//! The claim rules: what a claim does with the run key's ledger row, given
//! its state. Pure functions, shared by every backend and unit-tested here.

use super::{ClaimRequest, RunStatus, WorkerId};

/// The ledger row of a run key as a claim sees it, locked.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub status: RunStatus,
    pub run_id: Option<String>,
    pub lease_owner: Option<String>,
    pub lease_host: Option<String>,
    pub lease_pid: Option<i64>,
    pub lease_expires_at: Option<String>,
    /// Whether the lease has not yet expired (by the database's clock).
    pub lease_live: bool,
    pub checkpoint: Option<serde_json::Value>,
    pub result: Option<serde_json::Value>,
    /// Handler version and `[fields]` fingerprint the attempt started with.
    pub handler_version: Option<String>,
    pub fields_fingerprint: Option<String>,
    /// The attempt started while its period was open (`--allow-open`).
    pub provisional: bool,
}

/// What a claim does with the row it locked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    /// Report the stored result.
    Done(serde_json::Value),
    /// Leave it to its live holder.
    Held { owner: String, expires_at: String },
    /// Take it: resume `(checkpoint, run_id)` of a crashed attempt, or start fresh.
    Take {
        resume: Option<(serde_json::Value, String)>,
        /// A crashed attempt's history row must be marked lost.
        previous_lost: bool,
    },
}

/// The claim rules:
/// - done and not forced: report the stored result;
/// - running with a live lease whose holder is not provably dead: held;
/// - running otherwise (crashed): take over and resume from its checkpoint;
/// - pending after an interrupted attempt (it kept its checkpoint): take it
///   and resume;
/// - pending otherwise, failed, cancelled, or forced: take it and start the
///   period fresh (rows already committed stay; unchanged ones are not
///   rewritten).
///
/// A resume needs the claim not to be forced and the pipeline's version and
/// `[fields]` to be those of the stopped attempt (see [`resumable`]);
/// otherwise the period starts over.
pub(crate) fn decide(row: Snapshot, request: &ClaimRequest) -> Decision {
    match row.status {
        RunStatus::Done if !request.force => {
            return Decision::Done(row.result.unwrap_or_default());
        }
        RunStatus::Running => {}
        RunStatus::Pending => {
            return Decision::Take {
                resume: resume_point(row, request),
                previous_lost: false,
            };
        }
        RunStatus::Done | RunStatus::Failed | RunStatus::Cancelled => {
            return Decision::Take {
                resume: None,
                previous_lost: false,
            };
        }
    }
    if row.lease_live && !holder_is_dead(row.lease_host.as_deref(), row.lease_pid, &request.worker)
    {
        return Decision::Held {
            owner: row.lease_owner.unwrap_or_default(),
            expires_at: row.lease_expires_at.unwrap_or_default(),
        };
    }
    Decision::Take {
        resume: resume_point(row, request),
        previous_lost: true,
    }
}

/// The checkpoint and run id a claim resumes from, if it may.
fn resume_point(row: Snapshot, request: &ClaimRequest) -> Option<(serde_json::Value, String)> {
    let same_pipeline = resumable(&row, request);
    match (request.force, same_pipeline, row.checkpoint, row.run_id) {
        (false, true, Some(cp), Some(run_id)) => Some((cp, run_id)),
        _ => None,
    }
}

/// Whether a stopped attempt's committed batches may be continued: it ran
/// the same handler version and the same `[fields]` as this claim. Rows
/// written under other fields (a column added since) would otherwise stay
/// as they were, never re-read, under a ledger row that records the new
/// fingerprint and so never looks stale; the period starts over instead.
///
/// And it was as provisional as this claim: batches read while the period
/// was open are continued only while it is still open (the result stays
/// provisional); once it is due they are read again from the start, or a
/// final `done` would stand on rows read before the period closed.
pub(crate) fn resumable(row: &Snapshot, request: &ClaimRequest) -> bool {
    row.handler_version.as_deref() == Some(request.handler_version.as_str())
        && row.fields_fingerprint.as_deref().is_some_and(|done| {
            tidemark_core::fingerprint::same_fields(done, &request.fields_fingerprint)
        })
        && row.provisional == request.provisional
}

/// Whether a lease holder is provably dead: it ran on this host, it is not
/// this process, and no process with its pid exists here now.
pub(crate) fn holder_is_dead(
    holder_host: Option<&str>,
    holder_pid: Option<i64>,
    me: &WorkerId,
) -> bool {
    match (holder_host, holder_pid) {
        (Some(host), Some(pid)) if host == me.host => {
            pid != i64::from(me.pid) && process_is_gone(pid)
        }
        _ => false,
    }
}

/// Whether no process with `pid` exists on this host. Asked with signal 0
/// (`kill(pid, 0)`), which every Unix answers without `/proc`: `ESRCH` means
/// there is no such process; success or `EPERM` (it exists, owned by
/// another user) mean there is. A pid that cannot be a process id is gone.
/// Elsewhere nothing is provable, so the holder is presumed alive and its
/// lease runs out instead.
pub fn process_is_gone(pid: i64) -> bool {
    #[cfg(unix)]
    {
        use nix::errno::Errno;
        use nix::sys::signal::kill;
        use nix::unistd::Pid;
        let Ok(raw) = i32::try_from(pid) else {
            return true;
        };
        if raw <= 0 {
            // 0 and negative pids name process groups, never one process.
            return true;
        }
        matches!(kill(Pid::from_raw(raw), None), Err(Errno::ESRCH))
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn me() -> WorkerId {
        WorkerId {
            host: "h1".into(),
            pid: std::process::id(),
            instance: "x".into(),
        }
    }

    fn request(force: bool) -> ClaimRequest {
        ClaimRequest {
            force,
            handler_version: "1".into(),
            fields_fingerprint: "id:1".into(),
            provisional: false,
            worker: me(),
            lease_ttl: Duration::from_secs(30),
            notices: Default::default(),
        }
    }

    fn running(host: &str, pid: i64, live: bool) -> Snapshot {
        Snapshot {
            status: RunStatus::Running,
            run_id: Some("r1".into()),
            lease_owner: Some(format!("{host}:{pid}:i")),
            lease_host: Some(host.into()),
            lease_pid: Some(pid),
            lease_expires_at: Some("2030-01-01T00:00:00.000Z".into()),
            lease_live: live,
            checkpoint: Some(serde_json::json!({"records": 3})),
            result: None,
            handler_version: Some("1".into()),
            fields_fingerprint: Some("id:1".into()),
            provisional: false,
        }
    }

    #[test]
    fn a_provisional_attempt_is_continued_only_while_its_period_is_open() {
        let stopped = Snapshot {
            status: RunStatus::Pending,
            provisional: true,
            ..running("h2", 1, false)
        };
        let open = ClaimRequest {
            provisional: true,
            ..request(false)
        };
        // Still open: continued, provisional.
        assert!(matches!(
            decide(stopped.clone(), &open),
            Decision::Take {
                resume: Some(_),
                ..
            }
        ));
        // Due now: read again from the start, under a new run id.
        assert!(matches!(
            decide(stopped.clone(), &request(false)),
            Decision::Take { resume: None, .. }
        ));
        // The same for a crashed provisional attempt.
        let crashed = Snapshot {
            status: RunStatus::Running,
            ..stopped
        };
        assert!(matches!(
            decide(crashed, &request(false)),
            Decision::Take {
                resume: None,
                previous_lost: true
            }
        ));
    }

    #[test]
    fn only_gone_processes_on_this_host_are_dead() {
        let me = me();
        let gone = i64::from(i32::MAX);
        assert!(holder_is_dead(Some("h1"), Some(gone), &me));
        assert!(!holder_is_dead(Some("h1"), Some(1), &me)); // pid 1 always exists
        assert!(!holder_is_dead(Some("h2"), Some(gone), &me));
        assert!(!holder_is_dead(Some("h1"), Some(i64::from(me.pid)), &me));
        assert!(!holder_is_dead(None, None, &me));
    }

    #[test]
    fn a_live_process_is_found_without_proc() {
        let child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        let pid = i64::from(child.id());
        assert!(!process_is_gone(pid));
        let mut child = child;
        child.kill().expect("kill");
        child.wait().expect("reap");
        assert!(process_is_gone(pid));
        assert!(process_is_gone(-1) && process_is_gone(0) && process_is_gone(i64::MAX));
    }

    #[test]
    fn claims_follow_the_state() {
        let done = Snapshot {
            status: RunStatus::Done,
            result: Some(serde_json::json!({"status": "done"})),
            ..running("h1", 1, false)
        };
        assert!(matches!(
            decide(done.clone(), &request(false)),
            Decision::Done(_)
        ));
        assert!(matches!(
            decide(done, &request(true)),
            Decision::Take {
                resume: None,
                previous_lost: false
            }
        ));
        // A live holder on another host is held; after its lease, resumed.
        assert!(matches!(
            decide(running("h2", 1, true), &request(false)),
            Decision::Held { .. }
        ));
        assert_eq!(
            decide(running("h2", 1, false), &request(false)),
            Decision::Take {
                resume: Some((serde_json::json!({"records": 3}), "r1".into())),
                previous_lost: true
            }
        );
        // A dead holder on this host is taken over at once.
        let gone = i64::from(i32::MAX);
        assert!(matches!(
            decide(running("h1", gone, true), &request(false)),
            Decision::Take {
                resume: Some(_),
                previous_lost: true
            }
        ));
        // An interrupted attempt's pending key resumes; forced, it starts over.
        let interrupted = Snapshot {
            status: RunStatus::Pending,
            ..running("h2", 1, false)
        };
        assert!(matches!(
            decide(interrupted.clone(), &request(false)),
            Decision::Take {
                resume: Some(_),
                previous_lost: false
            }
        ));
        assert!(matches!(
            decide(interrupted, &request(true)),
            Decision::Take { resume: None, .. }
        ));
        let queued = Snapshot {
            status: RunStatus::Pending,
            checkpoint: None,
            ..running("h2", 1, true)
        };
        assert!(matches!(
            decide(queued, &request(false)),
            Decision::Take {
                resume: None,
                previous_lost: false
            }
        ));
        // A crashed attempt of another version or other fields starts over.
        for changed in [
            Snapshot {
                handler_version: Some("0".into()),
                ..running("h2", 1, false)
            },
            Snapshot {
                fields_fingerprint: Some("id:0".into()),
                ..running("h2", 1, false)
            },
            Snapshot {
                fields_fingerprint: None,
                ..running("h2", 1, false)
            },
        ] {
            assert_eq!(
                decide(changed, &request(false)),
                Decision::Take {
                    resume: None,
                    previous_lost: true
                }
            );
        }

        for status in [RunStatus::Failed, RunStatus::Cancelled] {
            let row = Snapshot {
                status,
                ..running("h2", 1, true)
            };
            assert!(matches!(
                decide(row, &request(false)),
                Decision::Take {
                    resume: None,
                    previous_lost: false
                }
            ));
        }
    }
}
