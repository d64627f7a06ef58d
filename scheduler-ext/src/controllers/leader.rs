//! Leader election over a `coordination.k8s.io/v1` Lease, so that of several replicas only one
//! hands out devices ([`Leadership::leads`]); the others answer reads and refuse commits.
//!
//! The rules are client-go's (`tools/leaderelection`), which kube-scheduler and Volcano use:
//! every `retry_period` each replica reads the Lease; the holder renews it; another replica
//! takes it only after the record has not changed for `lease_duration` by its *own* clock (so
//! clock offsets between machines do not matter). The holder counts itself leader only until
//! `renew_deadline` after the last successful renewal was *sent*; since `renew_deadline <
//! lease_duration`, it has stopped committing before anyone else may take the Lease. That is
//! the fence: two replicas never commit at once, as long as their clocks run at about the same
//! rate and a commit's writes finish within `lease_duration - renew_deadline` (the service's
//! write timeout is set below it).
//!
//! A new term does not start committing at once: the one who takes the Lease first reads the
//! pods' promises from the API server ([`Leadership::begin`] / [`Leadership::ready`]), so the
//! devices the previous leader handed out just before it stopped count as taken.
//!
//! kube-lease-manager and kube-leader-election exist, but neither says when the holder must
//! stop acting after its last renewal (the fence above), which is the property this service
//! needs, so this module keeps the Lease itself, in client-go's terms.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use tokio::sync::watch;

use crate::decider::Fence;

/// The Lease and its timing (client-go's flag names, kube-scheduler's defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    /// Unique per replica: the pod name (a restarted container of the same pod takes its own
    /// Lease back at once, the process before it being dead).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// Checks the timing rules that make the fence hold.
    pub fn validate(&self) -> Result<(), String> {
        if self.identity.is_empty() {
            return Err("the leader-election identity is empty".into());
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(format!(
                "the renew deadline ({:?}) must be shorter than the lease duration ({:?})",
                self.renew_deadline, self.lease_duration
            ));
        }
        if self.retry_period.is_zero() || self.retry_period * 2 > self.renew_deadline {
            return Err(format!(
                "the retry period ({:?}) must be positive and at most half the renew deadline ({:?})",
                self.retry_period, self.renew_deadline
            ));
        }
        Ok(())
    }

    /// The longest a commit's API writes may take: they must land before anyone else may lead.
    pub fn write_budget(&self) -> Duration {
        (self.lease_duration - self.renew_deadline) / 2
    }
}

/// Who leads, as this replica knows it. Without election ([`Leadership::sole`]) it always
/// leads.
#[derive(Debug)]
pub struct Leadership {
    elected: bool,
    /// Until when this replica may act as leader (monotonic clock); `None` when it does not
    /// hold the Lease.
    valid_until: Mutex<Option<Instant>>,
    /// Terms this replica began (each acquisition of the Lease is one).
    term: AtomicU64,
    /// The term whose start-up (reading the pods' promises) is done.
    ready_term: AtomicU64,
    /// The identity of the Lease's holder, as last read.
    holder: Mutex<String>,
    changed: watch::Sender<bool>,
}

/// The decider commits only while this replica leads.
impl Fence for Leadership {
    fn leads(&self) -> bool {
        Leadership::leads(self)
    }

    fn holder(&self) -> String {
        Leadership::holder(self)
    }
}

impl Leadership {
    /// A replica that leads alone (no election).
    pub fn sole() -> Self {
        let (changed, _) = watch::channel(true);
        Leadership {
            elected: false,
            valid_until: Mutex::new(None),
            term: AtomicU64::new(0),
            ready_term: AtomicU64::new(0),
            holder: Mutex::new(String::new()),
            changed,
        }
    }

    fn elected() -> Self {
        Leadership {
            elected: true,
            ..Self::sole()
        }
    }

    /// True while this replica may hand out devices: it holds the Lease, has renewed it within
    /// the renew deadline, and has read the promises of its term.
    pub fn leads(&self) -> bool {
        if !self.elected {
            return true;
        }
        let valid = lock(&self.valid_until).is_some_and(|until| Instant::now() < until);
        valid && self.ready_term.load(Ordering::Acquire) == self.term.load(Ordering::Acquire)
    }

    /// True when leader election is on.
    pub fn is_elected(&self) -> bool {
        self.elected
    }

    /// The Lease's holder as last read ("" when free or not elected).
    pub fn holder(&self) -> String {
        lock(&self.holder).clone()
    }

    /// Changes of [`Self::holds`] (true: this replica took the Lease; false: it lost it).
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.changed.subscribe()
    }

    /// True while this replica holds a valid Lease, start-up done or not.
    pub fn holds(&self) -> bool {
        !self.elected || lock(&self.valid_until).is_some_and(|until| Instant::now() < until)
    }

    /// The current term, for [`Self::ready`] after its start-up.
    pub fn begin(&self) -> u64 {
        self.term.load(Ordering::Acquire)
    }

    /// Marks `term`'s start-up done; ignored when another term began since.
    pub fn ready(&self, term: u64) {
        if self.term.load(Ordering::Acquire) == term {
            self.ready_term.store(term, Ordering::Release);
        }
    }

    fn renewed(&self, sent: Instant, renew_deadline: Duration, new_term: bool) {
        if new_term {
            self.term.fetch_add(1, Ordering::AcqRel);
        }
        *lock(&self.valid_until) = Some(sent + renew_deadline);
        if new_term {
            self.changed.send_replace(true);
        }
    }

    fn lost(&self) {
        let was = lock(&self.valid_until).take().is_some();
        if was {
            self.changed.send_replace(false);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What this replica last saw of the Lease, to judge its expiry by the local clock.
struct Observed {
    /// holderIdentity, renewTime and resourceVersion: a change of any is a sign of life.
    record: (String, Option<String>, Option<String>),
    at: Instant,
}

/// Starts the election loop; the returned [`Leadership`] follows it.
pub fn spawn(client: Client, config: LeaseConfig) -> std::sync::Arc<Leadership> {
    let leadership = std::sync::Arc::new(Leadership::elected());
    let l = std::sync::Arc::clone(&leadership);
    tokio::spawn(async move {
        let api: Api<Lease> = Api::namespaced(client, &config.namespace);
        let mut observed: Option<Observed> = None;
        let mut failing_since: Option<Instant> = None;
        loop {
            let sent = Instant::now();
            match round(&api, &config, &mut observed, &l).await {
                Ok(Some(new_term)) => {
                    if new_term {
                        tracing::info!(identity = %config.identity, lease = %config.name, "took the lease: leading");
                    }
                    l.renewed(sent, config.renew_deadline, new_term);
                    failing_since = None;
                }
                Ok(None) => l.lost(),
                Err(e) => {
                    let since = *failing_since.get_or_insert(sent);
                    // The fence: past the renew deadline without a renewal, stop leading.
                    if l.holds()
                        && sent.duration_since(since) + config.retry_period >= config.renew_deadline
                    {
                        tracing::warn!(error = %e, "cannot renew the lease: no longer leading");
                    } else {
                        tracing::warn!(error = %e, "reading or renewing the lease failed; retrying");
                    }
                }
            }
            if !l.holds() {
                l.lost();
            }
            tokio::time::sleep(config.retry_period).await;
        }
    });
    leadership
}

/// One look at the Lease: `Ok(Some(new_term))` when this replica holds it after the round,
/// `Ok(None)` when another does.
async fn round(
    api: &Api<Lease>,
    config: &LeaseConfig,
    observed: &mut Option<Observed>,
    l: &Leadership,
) -> Result<Option<bool>, kube::Error> {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let lease = match api.get_opt(&config.name).await? {
        Some(lease) => lease,
        None => {
            let fresh = Lease {
                metadata: ObjectMeta {
                    name: Some(config.name.clone()),
                    namespace: Some(config.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(spec(config, now.clone(), now, 0)),
            };
            return match api.create(&PostParams::default(), &fresh).await {
                Ok(_) => Ok(Some(true)),
                // Another replica created it first.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
                Err(e) => Err(e),
            };
        }
    };
    let s = lease.spec.clone().unwrap_or_default();
    let holder = s.holder_identity.clone().unwrap_or_default();
    *lock(&l.holder) = holder.clone();
    let record = (
        holder.clone(),
        s.renew_time.as_ref().map(|t| t.0.to_string()),
        lease.resource_version(),
    );
    if observed.as_ref().is_none_or(|o| o.record != record) {
        *observed = Some(Observed {
            record,
            at: Instant::now(),
        });
    }
    let ours = holder == config.identity;
    let duration = s
        .lease_duration_seconds
        .and_then(|d| u64::try_from(d).ok())
        .map_or(config.lease_duration, Duration::from_secs);
    let expired = observed
        .as_ref()
        .is_some_and(|o| o.at.elapsed() >= duration);
    if !ours && !holder.is_empty() && !expired {
        return Ok(None);
    }
    let new_term = !ours || !l.holds();
    let (acquired, transitions) = if ours {
        (
            s.acquire_time.clone().unwrap_or_else(|| now.clone()),
            s.lease_transitions.unwrap_or(0),
        )
    } else {
        (now.clone(), s.lease_transitions.unwrap_or(0) + 1)
    };
    let mut next = lease.clone();
    next.spec = Some(spec(config, acquired, now, transitions));
    // replace carries the resourceVersion read above: of two replicas racing, one wins.
    match api
        .replace(&config.name, &PostParams::default(), &next)
        .await
    {
        Ok(_) => Ok(Some(new_term)),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
        Err(e) => Err(e),
    }
}

fn spec(
    config: &LeaseConfig,
    acquired: MicroTime,
    renewed: MicroTime,
    transitions: i32,
) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(config.identity.clone()),
        lease_duration_seconds: i32::try_from(config.lease_duration.as_secs().max(1)).ok(),
        acquire_time: Some(acquired),
        renew_time: Some(renewed),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

/// Gives the Lease up (on shutdown) when this replica holds it, so another takes over at once.
pub async fn release(client: Client, config: &LeaseConfig, leadership: &Leadership) {
    if !leadership.is_elected() || !leadership.holds() {
        return;
    }
    leadership.lost();
    let api: Api<Lease> = Api::namespaced(client, &config.namespace);
    let result = async {
        let mut lease = api.get(&config.name).await?;
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        api.replace(&config.name, &PostParams::default(), &lease)
            .await
            .map(drop)
    }
    .await;
    match result {
        Ok(()) => tracing::info!(lease = %config.name, "gave the lease up"),
        Err(e) => tracing::warn!(error = %e, "giving the lease up failed; it expires by itself"),
    }
}
