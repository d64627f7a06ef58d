//! Waiting for the system under test: [`eventually`] polls until a condition holds, and a
//! [`Fatal`] error ends the wait at once.

use std::time::Duration;

use anyhow::{Result, anyhow};

/// Marks an error as final for [`eventually`]: it stops polling at once.
#[derive(Debug)]
pub struct Fatal(pub String);

impl std::fmt::Display for Fatal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Fatal {}

/// Polls `f` every 100 ms until it yields `Some`, or fails after `timeout`
/// with the last error (if any). An error that is a [`Fatal`] ends it at once.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match f().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => {}
            Err(e) if e.is::<Fatal>() => return Err(e.context(format!("waiting for {what}"))),
            Err(e) => last_err = Some(e),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(match last_err {
                Some(e) => e.context(format!("timed out after {timeout:?} waiting for {what}")),
                None => anyhow!("timed out after {timeout:?} waiting for {what}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
