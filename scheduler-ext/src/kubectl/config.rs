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

/// `-n`, else the context's namespace (kube-rs sets `default` when the context has none).
fn namespace(global: &Global, config: &Config) -> String {
    global
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone())
}

/// Connects as `global` says.
pub async fn connect(global: &Global) -> Result<Connection> {
    let config = client_config(global).await?;
    let namespace = namespace(global, &config);
    let client = Client::try_from(config).context("building the API client")?;
    Ok(Connection { client, namespace })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = r#"apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: u
  user: {token: t}
contexts:
- name: ml
  context: {cluster: c, user: u, namespace: ml}
- name: plain
  context: {cluster: c, user: u}
current-context: ml
"#;

    fn global(path: &std::path::Path, context: Option<&str>, ns: Option<&str>) -> Global {
        Global {
            kubeconfig: Some(path.to_path_buf()),
            context: context.map(String::from),
            namespace: ns.map(String::from),
            output: None,
        }
    }

    #[tokio::test]
    async fn namespace_from_flag_then_context_then_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        std::fs::write(&path, KUBECONFIG).unwrap();
        let cases = [
            (None, None, "ml"),
            (Some("plain"), None, "default"),
            (Some("plain"), Some("x"), "x"),
            (None, Some("y"), "y"),
        ];
        for (context, ns, want) in cases {
            let g = global(&path, context, ns);
            let config = client_config(&g).await.unwrap();
            assert_eq!(namespace(&g, &config), want, "{context:?} {ns:?}");
        }
        let e = client_config(&global(&path, Some("gone"), None))
            .await
            .unwrap_err();
        assert!(format!("{e:#}").contains("context \"gone\""), "{e:#}");
    }
}
