//! The API client and namespace the way kubectl chooses them: `--kubeconfig`, else
//! `KUBECONFIG`, else `~/.kube/config`, else the in-cluster service account; `--context` picks
//! a context; the namespace is `-n`, else the context's, else `default`.

use anyhow::{Context, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::Global;

/// A client and the namespace pod names are looked up in.
#[derive(Clone)]
pub struct Connection {
    pub client: Client,
    pub namespace: String,
}

/// The client configuration `global` asks for.
pub async fn client_config(global: &Global) -> Result<Config> {
    let options = KubeConfigOptions {
        context: global.context.clone(),
        ..KubeConfigOptions::default()
    };
    match (&global.kubeconfig, &global.context) {
        (Some(path), context) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kc, &options)
                .await
                .with_context(|| match context {
                    Some(c) => format!("kubeconfig {}, context {c:?}", path.display()),
                    None => format!("kubeconfig {}", path.display()),
                })
        }
        // A named context only exists in a kubeconfig: no in-cluster fallback.
        (None, Some(context)) => Config::from_kubeconfig(&options)
            .await
            .with_context(|| format!("kubeconfig context {context:?}")),
        (None, None) => Config::infer()
            .await
            .context("no kubeconfig (KUBECONFIG, ~/.kube/config) and not in a cluster"),
    }
}

/// Connects as `global` says.
pub async fn connect(global: &Global) -> Result<Connection> {
    let config = client_config(global).await?;
    let namespace = global
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).context("building the API client")?;
    Ok(Connection { client, namespace })
}
