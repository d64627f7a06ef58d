//! Child processes that cannot outlive the test.
//!
//! Each [`Proc`] runs in its own process group, with stdout and stderr in files
//! under the cluster's temp dir. Dropping it sends SIGTERM to the whole group,
//! waits up to five seconds, then sends SIGKILL. The child also gets
//! `PR_SET_PDEATHSIG = SIGKILL`, so it dies with the test process even when
//! drop never runs (the test binary is killed).

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// A running child process group.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    stdout: PathBuf,
    log: PathBuf,
    stopped: bool,
    /// How it was started, for [`Proc::restart_if_exited`].
    command: (PathBuf, Vec<String>, Vec<(String, String)>),
}

impl Proc {
    /// Starts `program args...`; stdout goes to `<logs>/<name>.stdout`, stderr to `<logs>/<name>.log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], logs: &Path) -> Result<Proc> {
        Self::spawn_with_env(name, program, args, &[], logs)
    }

    /// [`Proc::spawn`] with extra environment variables.
    pub fn spawn_with_env(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        logs: &Path,
    ) -> Result<Proc> {
        std::fs::create_dir_all(logs)?;
        let stdout = logs.join(format!("{name}.stdout"));
        let log = logs.join(format!("{name}.log"));
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let child = start(name, program, args, &env, &stdout, &log, false)?;
        Ok(Proc {
            name: name.to_string(),
            child,
            stdout,
            log,
            stopped: false,
            command: (program.to_path_buf(), args.to_vec(), env),
        })
    }

    /// Starts the process again, as a Deployment's pod restarts, when it has exited; its
    /// logs go on in the same files. Returns whether it restarted.
    pub fn restart_if_exited(&mut self) -> Result<bool> {
        if self.stopped || self.child.try_wait()?.is_none() {
            return Ok(false);
        }
        let (program, args, env) = &self.command;
        self.child = start(
            &self.name,
            program,
            args,
            env,
            &self.stdout,
            &self.log,
            true,
        )?;
        Ok(true)
    }

    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Process id (also the process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Path of the stdout file.
    pub fn stdout_path(&self) -> &Path {
        &self.stdout
    }

    /// Path of the stderr log.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// `Ok(())` while running; an error with the log tail once it has exited.
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => anyhow::bail!(
                "{} exited ({status}); last log lines:\n{}",
                self.name,
                self.log_tail(40)
            ),
        }
    }

    /// The last `n` lines of the stderr log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// SIGKILL to the group at once (a crash), and reaps the child.
    pub fn kill(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let _ = killpg(Pid::from_raw(self.child.id() as i32), Signal::SIGKILL);
        let _ = self.child.wait();
    }

    /// SIGTERM to the group, up to 5 s grace, then SIGKILL; reaps the child.
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let pgid = Pid::from_raw(self.child.id() as i32);
        if let Ok(None) = self.child.try_wait() {
            let _ = killpg(pgid, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
        }
        // The leader may be gone while others in its group are not.
        let _ = killpg(pgid, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// Spawns `program` in a process group of its own, dying with the test process; output to
/// `stdout` and `log`, appended to when `append`.
fn start(
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(String, String)],
    stdout: &Path,
    log: &Path,
    append: bool,
) -> Result<Child> {
    let open = |p: &Path| {
        File::options()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(p)
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(open(stdout)?)
        .stderr(open(log)?)
        .process_group(0);
    // SAFETY: the closure runs in the forked child before exec and only makes
    // one prctl(2) system call, which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
    cmd.spawn()
        .with_context(|| format!("starting {name} ({})", program.display()))
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What a process holds at one moment, read from `/proc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// Resident set size, KiB.
    pub rss_kib: u64,
    /// User plus system CPU time, in clock ticks (`getconf CLK_TCK`).
    pub cpu_ticks: u64,
    /// Open file descriptors.
    pub fds: usize,
}

impl Footprint {
    /// Samples process `pid`.
    pub fn of(pid: u32) -> Result<Footprint> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("reading /proc/{pid}/status"))?;
        let rss_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .context("no VmRSS in /proc/<pid>/status")?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("reading /proc/{pid}/stat"))?;
        // Fields after the command name (which may hold spaces): utime and stime are the 14th
        // and 15th fields overall.
        let after = stat
            .rfind(')')
            .and_then(|i| stat.get(i + 2..))
            .context("malformed /proc/<pid>/stat")?;
        let fields: Vec<&str> = after.split_whitespace().collect();
        let field = |i: usize| -> Result<u64> {
            fields
                .get(i)
                .and_then(|f| f.parse().ok())
                .context("malformed /proc/<pid>/stat")
        };
        let cpu_ticks = field(11)? + field(12)?;
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .with_context(|| format!("listing /proc/{pid}/fd"))?
            .count();
        Ok(Footprint {
            rss_kib,
            cpu_ticks,
            fds,
        })
    }

    pub fn rss_mib(&self) -> f64 {
        self.rss_kib as f64 / 1024.0
    }
}

/// User plus system CPU time, in clock ticks, of the threads of process `pid` whose name
/// (`/proc/<pid>/task/<tid>/comm`, at most 15 bytes) starts with `prefix`; 0 when none.
pub fn thread_cpu_ticks(pid: u32, prefix: &str) -> Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("listing /proc/{pid}/task"))?
    {
        let dir = task?.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.trim_end().starts_with(prefix) {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        let fields: Vec<u64> = stat
            .rfind(')')
            .and_then(|i| stat.get(i + 2..))
            .map(|after| {
                after
                    .split_whitespace()
                    .skip(11)
                    .take(2)
                    .filter_map(|f| f.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        total += fields.iter().sum::<u64>();
    }
    Ok(total)
}

/// Clock ticks per second (`getconf CLK_TCK`), the unit of [`Footprint::cpu_ticks`].
pub fn clock_ticks_per_second() -> Result<f64> {
    let out = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .context("running getconf CLK_TCK")?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .context("getconf CLK_TCK printed no number")
}

/// The `p` quantile of `sorted` (nearest rank; zero when empty), for the benches' latencies.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
