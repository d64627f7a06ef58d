//! The one way a test starts `fumarole-agent run`: an [`AgentBuilder`] says what the agent
//! discovers (a bundled fixture or a root), which node it is, where its device plugins, kubelet
//! files, stand-in vendor libraries and metrics are, and then spawns it as a [`Proc`] (the test
//! owns it), or hands it to a [`TestCluster`] (stopped with the cluster, or by name).
//!
//! Start at [`AgentBuilder::fixture`] or [`AgentBuilder::root`]. The argument list comes out
//! in a fixed shape: `run`, `--standalone` if asked, the source (`--fixture` / `--root`),
//! `--node-name`, then every other flag in the order it was set; setting a flag again replaces
//! its value in place, so a preset (like [`crate::colocation::agent`]) can be adjusted.
//! Presets for whole kinds of agents live beside what they need: [`crate::colocation::agent`],
//! [`crate::fleet::start`] and [`TestCluster::start_dra_agent`] (in [`crate::dra`]).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;

use crate::cluster::TestCluster;
use crate::fumarole::agent_bin;
use crate::process::Proc;

/// The process name an agent gets unless [`AgentBuilder::process`] says otherwise: its log is
/// `<logs>/fumarole-agent.log` and [`TestCluster::stop`] finds it by this name.
pub const DEFAULT_PROCESS: &str = "fumarole-agent";

/// What the agent discovers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// One of the agent's bundled fixtures (`--fixture`).
    Fixture(String),
    /// A filesystem root (`--root`), e.g. a fixture written out with
    /// [`crate::fumarole::fixture_root`] so the test can change it.
    Root(PathBuf),
}

/// A `fumarole-agent run` to start; see the module documentation.
#[derive(Debug, Clone)]
pub struct AgentBuilder {
    process: String,
    standalone: bool,
    source: Source,
    node: Option<String>,
    /// Every other argument, in order: `--flag value` pairs set with [`AgentBuilder::flag`]
    /// and lone arguments added with [`AgentBuilder::arg`].
    rest: Vec<Arg>,
    env: Vec<(String, String)>,
    kubeconfig: Option<PathBuf>,
    metrics_port: Option<u16>,
    without_capabilities: bool,
    /// Shell commands run as root in a private mount namespace before the agent starts.
    mount_setup: Option<String>,
}

#[derive(Debug, Clone)]
enum Arg {
    Flag(String, String),
    Lone(String),
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

impl AgentBuilder {
    fn with_source(source: Source) -> Self {
        AgentBuilder {
            process: DEFAULT_PROCESS.into(),
            standalone: false,
            source,
            node: None,
            rest: Vec::new(),
            env: Vec::new(),
            kubeconfig: None,
            metrics_port: None,
            without_capabilities: false,
            mount_setup: None,
        }
    }

    /// An agent on the bundled fixture `name` (`--fixture name`).
    pub fn fixture(name: &str) -> Self {
        Self::with_source(Source::Fixture(name.into()))
    }

    /// An agent on the filesystem root `root` (`--root root`).
    pub fn root(root: &Path) -> Self {
        Self::with_source(Source::Root(root.to_path_buf()))
    }

    /// Discovers `root` instead of what it discovered so far (a preset's fixture).
    pub fn on_root(mut self, root: &Path) -> Self {
        self.source = Source::Root(root.to_path_buf());
        self
    }

    /// Its process name: the log is `<logs>/<name>.log`, and a cluster-owned agent is stopped
    /// by it ([`TestCluster::stop`]). [`DEFAULT_PROCESS`] unless set.
    pub fn process(mut self, name: &str) -> Self {
        self.process = name.into();
        self
    }

    /// `--standalone`: device plugins only, no API server.
    pub fn standalone(mut self) -> Self {
        self.standalone = true;
        self
    }

    /// `--node-name`.
    pub fn node(mut self, node: &str) -> Self {
        self.node = Some(node.into());
        self
    }

    /// `flag value` (e.g. `"--recheck-interval", "1s"`); a flag set before keeps its place and
    /// takes the new value.
    pub fn flag(mut self, flag: &str, value: impl Into<String>) -> Self {
        let value = value.into();
        match self
            .rest
            .iter_mut()
            .find(|a| matches!(a, Arg::Flag(f, _) if f == flag))
        {
            Some(Arg::Flag(_, v)) => *v = value,
            _ => self.rest.push(Arg::Flag(flag.into(), value)),
        }
        self
    }

    /// [`AgentBuilder::flag`] with a path for its value.
    pub fn path_flag(self, flag: &str, value: &Path) -> Self {
        self.flag(flag, path(value))
    }

    /// One argument as it is: a switch (`--cdi`), or a `--flag=value` a test spells itself.
    pub fn arg(mut self, arg: &str) -> Self {
        self.rest.push(Arg::Lone(arg.into()));
        self
    }

    /// [`AgentBuilder::arg`] for each.
    pub fn args<S: AsRef<str>>(self, args: impl IntoIterator<Item = S>) -> Self {
        args.into_iter().fold(self, |b, a| b.arg(a.as_ref()))
    }

    /// `--device-plugin-dir`: where its device plugins serve (a kubelet's or
    /// `kubelet-dm`'s `device-plugins` directory).
    pub fn device_plugin_dir(self, dir: &Path) -> Self {
        self.flag("--device-plugin-dir", path(dir))
    }

    /// `--kubelet-config`.
    pub fn kubelet_config(self, file: &Path) -> Self {
        self.flag("--kubelet-config", path(file))
    }

    /// `--cpu-manager-state`.
    pub fn cpu_manager_state(self, file: &Path) -> Self {
        self.flag("--cpu-manager-state", path(file))
    }

    /// `--pod-resources-socket`.
    pub fn pod_resources_socket(self, socket: &Path) -> Self {
        self.flag("--pod-resources-socket", path(socket))
    }

    /// Its kubelet inputs (configuration, CPU manager checkpoint, PodResources socket) at files
    /// that do not exist under `dir`: an agent on a fixture must not read the host's kubelet.
    pub fn without_host_kubelet(self, dir: &Path) -> Self {
        self.kubelet_config(&dir.join("absent.yaml"))
            .cpu_manager_state(&dir.join("absent_state"))
            .pod_resources_socket(&dir.join("absent.sock"))
    }

    /// `--metrics-addr 127.0.0.1:<port>`; [`AgentBuilder::metrics_port`] tells it back.
    pub fn metrics_on_port(mut self, port: u16) -> Self {
        self.metrics_port = Some(port);
        self.flag("--metrics-addr", format!("127.0.0.1:{port}"))
    }

    /// The port its `/metrics` serves on, if set.
    pub fn metrics_port(&self) -> Option<u16> {
        self.metrics_port
    }

    /// NVML from the stand-in library `lib` (`--nvml-library`), answering from the state file
    /// `state` (`FUMAROLE_NVML_STANDIN`).
    pub fn nvml_standin(self, lib: &Path, state: &Path) -> Self {
        self.flag("--nvml-library", path(lib))
            .env("FUMAROLE_NVML_STANDIN", &path(state))
    }

    /// DCMI from the stand-in library `lib` (`--dcmi-library`), answering from the state file
    /// `state` (`FUMAROLE_DCMI_STANDIN`).
    pub fn dcmi_standin(self, lib: &Path, state: &Path) -> Self {
        self.flag("--dcmi-library", path(lib))
            .env("FUMAROLE_DCMI_STANDIN", &path(state))
    }

    /// An environment variable (`FUMAROLE_LOG`, `RUST_LOG`, ...).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Acts as whoever `kubeconfig` says (a ServiceAccount, a user through a fault proxy)
    /// instead of the cluster's admin.
    pub fn kubeconfig(mut self, kubeconfig: &Path) -> Self {
        self.kubeconfig = Some(kubeconfig.to_path_buf());
        self
    }

    /// Runs it as the chart runs it: root, but with no capability at all (an empty bounding
    /// set, `no_new_privs`), through util-linux's `setpriv`.
    pub fn without_capabilities(mut self) -> Self {
        self.without_capabilities = true;
        self
    }

    /// Starts it in a private mount namespace (util-linux's `unshare --mount`) where `setup`,
    /// `sh` commands run as root, first arranges the mounts it sees (as a DaemonSet's
    /// volumes do); the process keeps its pid (each step `exec`s the next).
    pub fn in_mount_namespace(mut self, setup: &str) -> Self {
        self.mount_setup = Some(setup.to_string());
        self
    }

    /// The arguments after the program name (`run ...`).
    pub fn argv(&self) -> Vec<String> {
        let mut out = vec!["run".to_string()];
        if self.standalone {
            out.push("--standalone".into());
        }
        match &self.source {
            Source::Fixture(name) => out.extend(["--fixture".into(), name.clone()]),
            Source::Root(root) => out.extend(["--root".into(), path(root)]),
        }
        if let Some(node) = &self.node {
            out.extend(["--node-name".into(), node.clone()]);
        }
        for a in &self.rest {
            match a {
                Arg::Flag(f, v) => out.extend([f.clone(), v.clone()]),
                Arg::Lone(a) => out.push(a.clone()),
            }
        }
        out
    }

    /// The program to execute and its arguments: the agent binary, or `setpriv` around it,
    /// and `unshare` around that.
    fn program(&self) -> Result<(PathBuf, Vec<String>)> {
        let (program, args) = self.dropping_capabilities()?;
        let Some(setup) = &self.mount_setup else {
            return Ok((program, args));
        };
        let mut wrapped: Vec<String> =
            ["--mount", "--propagation", "private", "--", "/bin/sh", "-c"]
                .map(String::from)
                .into();
        wrapped.push(format!("set -e\n{setup}\nexec \"$@\""));
        wrapped.push("sh".into());
        wrapped.push(path(&program));
        wrapped.extend(args);
        Ok((PathBuf::from("unshare"), wrapped))
    }

    /// The agent binary and its arguments, or `setpriv` around them.
    fn dropping_capabilities(&self) -> Result<(PathBuf, Vec<String>)> {
        let agent = agent_bin()?;
        if !self.without_capabilities {
            return Ok((agent, self.argv()));
        }
        let mut wrapped: Vec<String> = [
            "--reuid=0",
            "--regid=0",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
        .map(String::from)
        .into();
        wrapped.push(path(&agent));
        wrapped.extend(self.argv());
        Ok((PathBuf::from("setpriv"), wrapped))
    }

    /// Its environment: `KUBECONFIG` (the one set, else `default`, if any) first, then the
    /// variables set, in order.
    fn environment(&self, default_kubeconfig: Option<&Path>) -> Vec<(String, String)> {
        let kubeconfig = self.kubeconfig.as_deref().or(default_kubeconfig);
        kubeconfig
            .map(|k| ("KUBECONFIG".to_string(), path(k)))
            .into_iter()
            .chain(self.env.iter().cloned())
            .collect()
    }

    fn spawn_with(&self, logs: &Path, default_kubeconfig: Option<&Path>) -> Result<Proc> {
        let (program, args) = self.program()?;
        let env = self.environment(default_kubeconfig);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        // Printed for the test's output: which agent ran with what, when a test fails.
        eprintln!(
            "starting {} ({}): {}",
            self.process,
            program.display(),
            args.join(" ")
        );
        Proc::spawn_with_env(&self.process, &program, &args, &env, logs)
    }

    /// Starts it with its logs in `logs` and no `KUBECONFIG` but the one set (a standalone
    /// agent needs none); the test owns the process.
    pub fn spawn(&self, logs: &Path) -> Result<Proc> {
        self.spawn_with(logs, None)
    }

    /// Starts it against `cluster` (its admin kubeconfig unless one is set, its logs in the
    /// cluster's); the test owns the process.
    pub fn spawn_in(&self, cluster: &TestCluster) -> Result<Proc> {
        self.spawn_with(
            &cluster.root().join("logs"),
            Some(cluster.admin_kubeconfig()),
        )
    }

    /// [`AgentBuilder::spawn_in`], the process then owned by `cluster`: stopped with it, or
    /// by name with [`TestCluster::stop`], and checked by [`TestCluster::check_processes`].
    pub fn start_in(&self, cluster: &TestCluster) -> Result<()> {
        cluster.adopt(self.spawn_in(cluster)?)
    }

    /// The command, not started, for a test that watches the process itself (its exit status
    /// and stderr); the caller sets its stdio.
    pub fn command(&self) -> Result<Command> {
        let (program, args) = self.program()?;
        let mut cmd = Command::new(program);
        cmd.args(args).envs(self.environment(None));
        Ok(cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_come_in_a_fixed_shape_and_a_flag_set_again_keeps_its_place() {
        let a = AgentBuilder::fixture("dgx-h100")
            .node("dgx-1")
            .flag("--colocation-config-namespace", "default")
            .arg("--cdi")
            .metrics_on_port(9000)
            .standalone()
            .flag("--colocation-config-namespace", "kube-system");
        assert_eq!(
            a.argv(),
            [
                "run",
                "--standalone",
                "--fixture",
                "dgx-h100",
                "--node-name",
                "dgx-1",
                "--colocation-config-namespace",
                "kube-system",
                "--cdi",
                "--metrics-addr",
                "127.0.0.1:9000",
            ]
        );
        assert_eq!(a.metrics_port(), Some(9000));
        let on_root = a.on_root(Path::new("/r")).argv();
        assert_eq!(on_root[2..4], ["--root", "/r"]);
    }

    #[test]
    fn kubelet_files_and_standins() {
        let a = AgentBuilder::root(Path::new("/r"))
            .without_host_kubelet(Path::new("/d"))
            .nvml_standin(Path::new("/l/libnvidia-ml.so.1"), Path::new("/s.json"))
            .env("FUMAROLE_LOG", "info");
        assert_eq!(
            a.argv()[3..],
            [
                "--kubelet-config",
                "/d/absent.yaml",
                "--cpu-manager-state",
                "/d/absent_state",
                "--pod-resources-socket",
                "/d/absent.sock",
                "--nvml-library",
                "/l/libnvidia-ml.so.1",
            ]
        );
        let kubeconfig = Path::new("/k");
        assert_eq!(
            a.environment(Some(kubeconfig)),
            [
                ("KUBECONFIG".to_string(), "/k".to_string()),
                ("FUMAROLE_NVML_STANDIN".into(), "/s.json".into()),
                ("FUMAROLE_LOG".into(), "info".into()),
            ]
        );
        assert_eq!(a.environment(None).len(), 2);
        let own = a.kubeconfig(Path::new("/own"));
        assert_eq!(own.environment(Some(kubeconfig))[0].1, "/own");
    }
}
