//! Agents serving a fixture node's devices through DRA (`servedBy: dra`), started with
//! [`TestCluster::start_dra_agent`] (an [`AgentBuilder`] preset), with their DRA plugin in a
//! harness node's kubelet directories ([`DraKubelet`]) or in directories of their own; and the
//! DeviceClasses of fumarole's drivers ([`TestCluster::install_dra_device_classes`]).

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::agent::AgentBuilder;
use crate::cluster::{TestCluster, free_port};
use crate::fumarole::fixture_root;

/// The kubelet-side directories a DRA agent's plugin uses when it runs under a kubelet (a
/// harness node's registry and plugins directories), and its CDI directory.
pub struct DraKubelet {
    pub registry: PathBuf,
    pub plugins: PathBuf,
    pub cdi: PathBuf,
}

/// A `fumarole-agent run` on a fresh root of a bundled fixture, serving that node's devices
/// of one vendor through DRA (`servedBy: dra`). Its directories go when it is dropped.
pub struct DraAgent {
    pub node: String,
    /// The fixture root (`dev/` holds the device nodes).
    pub root: PathBuf,
    /// The DRA driver of its devices.
    pub driver: &'static str,
    _dir: tempfile::TempDir,
}

impl DraAgent {
    /// The name of the node's ResourceSlice.
    pub fn slice(&self) -> String {
        format!("{}-{}", self.node, self.driver)
    }
}

impl TestCluster {
    /// Starts an agent for node `node` (the Node object is the caller's) on a fresh root of
    /// fixture `fixture`, its `vendor` devices served through DRA, re-checking every second;
    /// its DRA plugin in `kubelet`'s directories, else in directories of its own. `process`
    /// names it (`<process>-<node>`) for [`TestCluster::stop`] and the logs.
    pub fn start_dra_agent(
        &self,
        fixture: &str,
        vendor: &str,
        node: &str,
        kubelet: Option<&DraKubelet>,
        process: &str,
    ) -> Result<DraAgent> {
        self.start_dra_agent_with(fixture, vendor, node, kubelet, process, "")
    }

    /// [`Self::start_dra_agent`] with more settings for the vendor's device-plugin config
    /// entry (`setting` lines, as YAML under it: `"draShares: 2"`).
    pub fn start_dra_agent_with(
        &self,
        fixture: &str,
        vendor: &str,
        node: &str,
        kubelet: Option<&DraKubelet>,
        process: &str,
        setting: &str,
    ) -> Result<DraAgent> {
        self.start_fixture_dra_agent(fixture, vendor, node, kubelet, process, setting, None)
    }

    /// [`Self::start_dra_agent_with`] for Ascend NPUs of `fixture`, the node's DCMI answers
    /// from the DCMI stand-in `dcmi` (`(library, state file)`).
    #[allow(clippy::too_many_arguments)]
    pub fn start_ascend_dra_agent(
        &self,
        fixture: &str,
        dcmi: (&Path, &Path),
        node: &str,
        kubelet: Option<&DraKubelet>,
        process: &str,
        setting: &str,
    ) -> Result<DraAgent> {
        let dcmi = Some(Library::Dcmi(dcmi));
        self.start_fixture_dra_agent(fixture, "huawei", node, kubelet, process, setting, dcmi)
    }

    /// [`Self::start_dra_agent_at`] on a fresh root of fixture `fixture`.
    #[allow(clippy::too_many_arguments)]
    fn start_fixture_dra_agent(
        &self,
        fixture: &str,
        vendor: &str,
        node: &str,
        kubelet: Option<&DraKubelet>,
        process: &str,
        setting: &str,
        library: Option<Library<'_>>,
    ) -> Result<DraAgent> {
        let dir = tempfile::tempdir()?;
        let root = fixture_root(fixture, dir.path())?;
        self.start_dra_agent_at(dir, root, vendor, node, kubelet, process, setting, library)
    }

    /// [`Self::start_dra_agent_with`] for NVIDIA GPUs on a root made in `dir` by
    /// [`crate::standin::nvidia_root`], NVIDIA answers from the NVML stand-in `nvml`
    /// (`(library, state file)`).
    #[allow(clippy::too_many_arguments)]
    pub fn start_nvidia_dra_agent(
        &self,
        dir: tempfile::TempDir,
        root: PathBuf,
        nvml: (&Path, &Path),
        node: &str,
        kubelet: Option<&DraKubelet>,
        process: &str,
        setting: &str,
    ) -> Result<DraAgent> {
        self.start_dra_agent_at(
            dir,
            root,
            "nvidia",
            node,
            kubelet,
            process,
            setting,
            Some(Library::Nvml(nvml)),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn start_dra_agent_at(
        &self,
        dir: tempfile::TempDir,
        root: PathBuf,
        vendor: &str,
        node: &str,
        kubelet: Option<&DraKubelet>,
        process: &str,
        setting: &str,
        library: Option<Library<'_>>,
    ) -> Result<DraAgent> {
        let config = dir.path().join("device-plugin-config.yaml");
        let mut text = format!("resources:\n  - match: {{vendor: {vendor}}}\n    servedBy: dra\n");
        for line in setting.lines().filter(|l| !l.trim().is_empty()) {
            text.push_str(&format!("    {}\n", line.trim()));
        }
        std::fs::write(&config, text)?;
        for d in ["device-plugins", "plugins", "plugins_registry", "cdi"] {
            std::fs::create_dir_all(dir.path().join(d))?;
        }
        let own = |p: &str| dir.path().join(p);
        let (registry, plugins, cdi) = match kubelet {
            Some(k) => (k.registry.clone(), k.plugins.clone(), k.cdi.clone()),
            None => (own("plugins_registry"), own("plugins"), own("cdi")),
        };
        let mut agent = AgentBuilder::root(&root);
        match library {
            Some(Library::Nvml((lib, state))) => agent = agent.nvml_standin(lib, state),
            Some(Library::Dcmi((lib, state))) => agent = agent.dcmi_standin(lib, state),
            None => {}
        }
        agent
            .process(&format!("{process}-{node}"))
            .node(node)
            .path_flag("--device-plugin-config", &config)
            .device_plugin_dir(&own("device-plugins"))
            .path_flag("--dra-plugins-dir", &plugins)
            .path_flag("--dra-registry-dir", &registry)
            .path_flag("--cdi-dir", &cdi)
            .without_host_kubelet(dir.path())
            .flag("--recheck-interval", "1s")
            .flag("--health-poll-interval", "300ms")
            .metrics_on_port(free_port()?)
            .env("FUMAROLE_LOG", "info")
            .start_in(self)?;
        Ok(DraAgent {
            node: node.into(),
            root,
            driver: fumarole_topology::dra::driver_of(vendor),
            _dir: dir,
        })
    }

    /// Applies `deploy/dra` (the DeviceClasses of fumarole's drivers).
    pub async fn install_dra_device_classes(&self) -> Result<()> {
        for (_, object) in crate::deploy::kustomization(&crate::deploy::deploy_dir().join("dra"))? {
            crate::deploy::apply(&self.client(), &object, false).await?;
        }
        Ok(())
    }
}

/// A vendor library stand-in an agent loads: `(library, state file)`.
enum Library<'a> {
    Nvml((&'a Path, &'a Path)),
    Dcmi((&'a Path, &'a Path)),
}
