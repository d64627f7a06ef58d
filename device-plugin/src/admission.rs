//! Which pod the kubelet is admitting, and the devices the scheduler chose for it.
//!
//! The kubelet's device-plugin calls do not name the pod: for each container that needs devices
//! it sends `GetPreferredAllocation` (available devices, must-include, size) and then
//! `Allocate` (the devices it took). It admits the pods of its node one at a time, in the
//! order its watch of the node's pods delivers them (the order they were bound), not in
//! creation order (a pod created earlier may be bound later). The agent watches the same
//! pods from the same API server and numbers them as they arrive ([`BoundPod::arrival`]). So
//! the pod being admitted is the earliest-arrived pod bound to this node that asks for this
//! resource, has not started, and still needs at least the requested number of devices of it
//! (counted from this plugin's `Allocate`s, and from PodResources after a plugin restart).
//! [`Admissions::decide`] picks it from a [`PodSource`]'s snapshot.
//!
//! The scheduler extension's choice for that pod is its `fumarole.dev/devices` annotation
//! ([`crate::annotation`]). For an Ascend resource (`huawei.com/<Chip>`), Huawei's Volcano
//! plugin's choice, the pod's `huawei.com/<Chip>` annotation naming devices `<Chip>-<physical
//! id>` ([`fumarole_topology::annotation::ascend`]), is a choice too, mapped to this resource's
//! devices by physical id (davinci number). Which one decides ([`Admissions::chosen`]):
//! `fumarole.dev/devices` when it names devices of this resource or is unusable, else Huawei's;
//! when both name devices and they differ, fumarole's wins and the pod hears of it
//! ([`Outcome::Overruled`]). Either is honoured when it is valid for the pod (every resource it
//! names is one the pod asks for, no more devices than asked, every device one of this
//! resource on this node) and its next devices are available and cover the kubelet's
//! must-include ones; Huawei's, in addition, names no device that `fumarole.dev/devices`
//! promised another pod waiting on this node (fumarole keeps no ledger of Huawei's plugin's
//! choices, so its own promises win). Huawei's `predicate-time` is not needed: arrival
//! numbers are unique, so there is no tie among pending pods for it to break.
//! Otherwise the plugin chooses with `topology::select`, and says why ([`Outcome`]): the
//! [`PodSource`] turns outcomes into Events on the pod, metrics and log lines, so a difference
//! between the scheduler's choice and the container's devices is never silent. `Allocate`
//! then checks that the kubelet took the devices this plugin preferred ([`Admissions::allocated`]).
//!
//! Races, bounded: when the pod source does not show the pod yet (its watch lags the kubelet's),
//! or shows it bound without a choice although its scheduler writes choices after binding
//! (Volcano v1.10 binds without telling the extension, which annotates the bound pod at once),
//! the plugin waits up to [`AwaitChoice::timeout`] for the choice to arrive before it falls
//! back, and reports the fallback.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use fumarole_topology::annotation::ascend;

use crate::annotation::{self, DeviceChoice};

/// A pod bound to this node, as the device plugin needs to know it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BoundPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// When the pod source first saw the pod bound to this node (a sequence number in watch
    /// order): the kubelet admits pods in this order.
    pub arrival: u64,
    /// RFC 3339 creation time (breaks ties of `arrival`).
    pub created: String,
    /// `spec.schedulerName`.
    pub scheduler: String,
    /// Phase `Running`, `Succeeded` or `Failed`: admitted (or refused) already.
    pub started: bool,
    /// Phase `Succeeded` or `Failed`: the kubelet frees its devices.
    pub finished: bool,
    /// Being deleted, or gone from the API server before it started: the kubelet still admits
    /// a pod it was told of before the deletion, but no scheduler will write its choice now.
    pub deleting: bool,
    /// Effective request of each extended resource the pod asks for.
    pub requests: BTreeMap<String, u64>,
    /// The `fumarole.dev/devices` value, raw.
    pub choice: Option<String>,
    /// Huawei's per-resource choice annotations (`huawei.com/<Chip>` -> value), raw.
    pub ascend_choices: BTreeMap<String, String>,
    /// Devices of each resource the kubelet reports for the pod (PodResources).
    pub reported: BTreeMap<String, Vec<String>>,
}

impl fmt::Display for BoundPod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What became of the scheduler's choice for one container of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The scheduler's devices were preferred and the kubelet took them.
    Honoured { devices: Vec<String> },
    /// The pod carries no choice (not scheduled through fumarole): `select` chose.
    NoChoice,
    /// The annotation is unusable for this pod; ignored.
    Invalid { annotation: String, reason: String },
    /// Both `fumarole.dev/devices` and Huawei's annotation name devices, different ones:
    /// fumarole's are preferred.
    Overruled {
        annotation: String,
        named: Vec<String>,
        preferred: Vec<String>,
    },
    /// A valid choice that cannot be honoured now (devices taken, unhealthy, or not what the
    /// kubelet must include); `select` chose.
    NotHonoured { chosen: Vec<String>, reason: String },
    /// The kubelet allocated other devices than the ones this plugin preferred.
    Differs {
        preferred: Vec<String>,
        allocated: Vec<String>,
    },
    /// The kubelet's PodResources gives the pod devices this plugin had counted for another
    /// pod (`Allocate` does not name its pod: the plugin matched it to the wrong one).
    Misattributed {
        devices: Vec<String>,
        counted_for: String,
    },
    /// The pod's scheduler writes choices after binding, and none came in time.
    NoChoiceInTime { waited: Duration },
    /// The pod is being deleted and has no choice: no point waiting for one.
    Deleting,
}

impl Outcome {
    /// The metric label of the outcome.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Honoured { .. } => "honoured",
            Outcome::NoChoice => "no-choice",
            Outcome::Invalid { .. } => "invalid",
            Outcome::Overruled { .. } => "overruled",
            Outcome::NotHonoured { .. } => "not-honoured",
            Outcome::Differs { .. } => "differs",
            Outcome::Misattributed { .. } => "misattributed",
            Outcome::NoChoiceInTime { .. } => "no-choice-in-time",
            Outcome::Deleting => "pod-deleting",
        }
    }

    /// True when users should hear of it (a Warning Event on the pod).
    pub fn is_warning(&self) -> bool {
        !matches!(
            self,
            Outcome::Honoured { .. } | Outcome::NoChoice | Outcome::Deleting
        )
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Honoured { devices } => {
                write!(f, "got the scheduler's devices {}", devices.join(","))
            }
            Outcome::NoChoice => write!(f, "no device choice from the scheduler"),
            Outcome::Invalid { annotation, reason } => {
                write!(f, "ignoring {annotation}: {reason}")
            }
            Outcome::Overruled {
                annotation,
                named,
                preferred,
            } => write!(
                f,
                "{annotation} names {} but {} names {}; following {}",
                named.join(","),
                annotation::DEVICES_ANNOTATION,
                preferred.join(","),
                annotation::DEVICES_ANNOTATION
            ),
            Outcome::NotHonoured { chosen, reason } => write!(
                f,
                "cannot give the scheduler's devices {}: {reason}; choosing on the node",
                chosen.join(",")
            ),
            Outcome::Differs {
                preferred,
                allocated,
            } => write!(
                f,
                "the kubelet allocated {} instead of the scheduler's {}",
                allocated.join(","),
                preferred.join(",")
            ),
            Outcome::Misattributed {
                devices,
                counted_for,
            } => write!(
                f,
                "the kubelet gave this pod {}, which the device plugin had counted for pod \
                 {counted_for}; its account now follows the kubelet's (PodResources)",
                devices.join(",")
            ),
            Outcome::NoChoiceInTime { waited } => write!(
                f,
                "the scheduler's device choice did not arrive within {waited:?}; choosing on the node"
            ),
            Outcome::Deleting => write!(
                f,
                "the pod is being deleted before its admission; not waiting for a device choice"
            ),
        }
    }
}

/// Where the plugin learns about the node's pods and reports what it did with their choices
/// (the agent watches the API server and records Events and metrics; standalone mode has none).
pub trait PodSource: Send + Sync {
    /// The pods bound to this node, as last seen: with those being deleted, and for a while
    /// those deleted before they started (the kubelet may admit them still).
    fn bound(&self) -> Vec<BoundPod>;
    /// Tells users what became of the scheduler's choice for `pod` (resource `resource`).
    fn report(&self, pod: &BoundPod, resource: &str, outcome: &Outcome);
    /// Sets annotation `key` of `pod` to `value` (Huawei's `huawei.com/AscendReal` after
    /// `Allocate`). Sources that cannot write pods do nothing.
    fn annotate(&self, _pod: &BoundPod, _key: &str, _value: &str) {}
}

/// How long to wait for a choice the scheduler has not written yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwaitChoice {
    /// Schedulers (`spec.schedulerName`) that write the choice after binding.
    pub schedulers: BTreeSet<String>,
    /// Longest wait, for a pod not seen yet or a choice not written yet.
    pub timeout: Duration,
}

impl Default for AwaitChoice {
    fn default() -> Self {
        AwaitChoice {
            schedulers: BTreeSet::from(["volcano".to_string()]),
            timeout: Duration::from_secs(5),
        }
    }
}

/// One container's request from the kubelet.
#[derive(Clone, Copy, Debug)]
pub struct ContainerRequest<'a> {
    pub available: &'a [String],
    pub must_include: &'a [String],
    pub size: usize,
}

/// What to do with one `GetPreferredAllocation` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Prefer these devices (the scheduler's choice for `pod`).
    Prefer { pod: BoundPod, devices: Vec<String> },
    /// Choose with `select`; `pod` (when known) hears `outcome`.
    Select {
        pod: Option<BoundPod>,
        outcome: Outcome,
    },
    /// Ask again shortly: the pod or its choice may still arrive.
    Wait,
}

/// The pod being admitted and, when the scheduler chose, the devices preferred for its
/// container.
#[derive(Clone, Debug)]
struct Preferred {
    pod: BoundPod,
    devices: Vec<String>,
    /// From the scheduler's choice (else from `select`, checked against nothing).
    from_choice: bool,
}

/// Per resource: which pods got which devices from this plugin, and the last preference.
#[derive(Debug)]
pub struct Admissions {
    resource: String,
    /// The device ids of this resource on this node.
    known: BTreeSet<String>,
    /// How Huawei names this resource's devices, for an Ascend resource.
    ascend: Option<AscendNames>,
    state: Mutex<State>,
}

/// An Ascend resource's devices by Huawei's names (`<chip>-<physical id>`).
#[derive(Debug)]
struct AscendNames {
    chip: String,
    /// Physical id -> device id.
    by_physical: BTreeMap<u32, String>,
}

/// The choice annotation that decides this resource's devices for a pod.
#[derive(Debug)]
struct Chosen {
    annotation: String,
    /// The devices in order, or why the annotation is unusable.
    devices: Result<Vec<String>, String>,
    /// Huawei's annotation naming other devices than fumarole's, which won.
    overruled: Option<Outcome>,
}

#[derive(Debug, Default)]
struct State {
    /// Pod uid -> devices `Allocate` gave it.
    allocated: HashMap<String, Vec<String>>,
    /// Pod uid -> the last preference for it. Keyed, so a preference whose `Allocate` never
    /// came (the kubelet gave up on that pod) cannot be taken for the next pod's.
    preferred: HashMap<String, Preferred>,
}

impl Admissions {
    pub fn new(resource: &str, known: impl IntoIterator<Item = String>) -> Self {
        Admissions {
            resource: resource.to_string(),
            known: known.into_iter().collect(),
            ascend: None,
            state: Mutex::new(State::default()),
        }
    }

    /// Also honours Huawei's `huawei.com/<chip>` annotation, whose names `<chip>-<N>` mean
    /// the device of physical id N: `devices` gives each device id's physical id.
    pub fn with_ascend_names(
        mut self,
        chip: &str,
        devices: impl IntoIterator<Item = (u32, String)>,
    ) -> Self {
        self.ascend = Some(AscendNames {
            chip: chip.to_string(),
            by_physical: devices.into_iter().collect(),
        });
        self
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// The devices of this resource `pod` holds: from this plugin's `Allocate`s, or by
    /// PodResources' account (after a plugin restart).
    fn held(&self, state: &State, pod: &BoundPod) -> usize {
        let ours = state.allocated.get(&pod.uid).map_or(0, Vec::len);
        let reported = pod.reported.get(&self.resource).map_or(0, Vec::len);
        ours.max(reported)
    }

    /// The pod the kubelet is admitting for this resource: the earliest-arrived bound, not
    /// started pod that asks for it and still needs at least `size` devices of it.
    fn admitting(&self, state: &State, pods: &[BoundPod], size: usize) -> Option<BoundPod> {
        pods.iter()
            .filter(|p| !p.started)
            .filter(|p| {
                let wants = p.requests.get(&self.resource).copied().unwrap_or(0);
                let held = self.held(state, p) as u64;
                wants > held && wants - held >= size as u64
            })
            .min_by(|a, b| {
                (a.arrival, &a.created, &a.namespace, &a.name).cmp(&(
                    b.arrival,
                    &b.created,
                    &b.namespace,
                    &b.name,
                ))
            })
            .cloned()
    }

    /// The scheduler's devices of this resource for `pod`, if its `fumarole.dev/devices`
    /// choice is valid for it.
    fn choice_for(&self, pod: &BoundPod, value: &str) -> Result<Vec<String>, String> {
        let choice: DeviceChoice = annotation::parse(value).map_err(|e| e.to_string())?;
        for (resource, ids) in &choice {
            check_count(pod, resource, ids.len())?;
        }
        let ids = choice.get(&self.resource).cloned().unwrap_or_default();
        if let Some(unknown) = ids.iter().find(|id| !self.known.contains(*id)) {
            return Err(format!(
                "{unknown:?} is not a {} device of this node",
                self.resource
            ));
        }
        Ok(ids)
    }

    /// The devices Huawei's annotation `value` names for `pod`, if valid for it: the same
    /// checks as [`Self::choice_for`], on names mapped to this node's devices.
    fn ascend_choice_for(
        &self,
        names: &AscendNames,
        pod: &BoundPod,
        value: &str,
    ) -> Result<Vec<String>, String> {
        let physical = ascend::parse(&names.chip, value).map_err(|e| e.to_string())?;
        check_count(pod, &self.resource, physical.len())?;
        physical
            .iter()
            .map(|n| {
                names.by_physical.get(n).cloned().ok_or_else(|| {
                    format!(
                        "{:?} is not a {} device of this node",
                        ascend::name(&names.chip, *n),
                        self.resource
                    )
                })
            })
            .collect()
    }

    /// Which annotation decides this resource's devices for `pod` (see the module doc), or
    /// `None` when the pod carries neither.
    fn chosen(&self, pod: &BoundPod) -> Option<Chosen> {
        let ours = pod.choice.as_deref().map(|v| self.choice_for(pod, v));
        let theirs = self.ascend.as_ref().and_then(|names| {
            let value = pod.ascend_choices.get(&self.resource)?;
            Some(self.ascend_choice_for(names, pod, value))
        });
        let fumarole = |devices, overruled| Chosen {
            annotation: annotation::DEVICES_ANNOTATION.to_string(),
            devices,
            overruled,
        };
        match (ours, theirs) {
            (Some(Ok(ids)), theirs) if !ids.is_empty() => {
                let overruled = match theirs {
                    Some(Ok(named)) if !same_set(&named, &ids) => Some(Outcome::Overruled {
                        annotation: self.resource.clone(),
                        named,
                        preferred: ids.clone(),
                    }),
                    _ => None,
                };
                Some(fumarole(Ok(ids), overruled))
            }
            (Some(Err(reason)), _) => Some(fumarole(Err(reason), None)),
            (_, Some(devices)) => Some(Chosen {
                annotation: self.resource.clone(),
                devices,
                overruled: None,
            }),
            (Some(Ok(none)), None) => Some(fumarole(Ok(none), None)),
            (None, None) => None,
        }
    }

    /// Huawei's annotation naming other devices for `pod` than `fumarole.dev/devices`, which
    /// wins: the plugin reports it when it prefers fumarole's.
    pub fn overruled(&self, pod: &BoundPod) -> Option<Outcome> {
        self.chosen(pod)?.overruled
    }

    /// `huawei.com/AscendReal` for `pod` when this is an Ascend resource: Huawei's names of
    /// the devices of this resource the pod holds, by physical id.
    pub fn ascend_real(&self, pod: &BoundPod) -> Option<String> {
        let names = self.ascend.as_ref()?;
        let state = self.state();
        let held: BTreeSet<&String> = state
            .allocated
            .get(&pod.uid)
            .into_iter()
            .flatten()
            .chain(pod.reported.get(&self.resource).into_iter().flatten())
            .collect();
        let physical: Vec<u32> = names
            .by_physical
            .iter()
            .filter(|(_, id)| held.contains(id))
            .map(|(n, _)| *n)
            .collect();
        (!physical.is_empty()).then(|| ascend::format(&names.chip, physical))
    }

    /// What to answer for one container. `waited` is how long this request has already waited;
    /// past `await_choice.timeout` the plugin stops waiting.
    pub fn decide(
        &self,
        pods: &[BoundPod],
        req: ContainerRequest<'_>,
        await_choice: &AwaitChoice,
        waited: Duration,
    ) -> Decision {
        let mut state = self.state();
        let may_wait = waited < await_choice.timeout;
        let Some(pod) = self.admitting(&state, pods, req.size) else {
            return if may_wait {
                Decision::Wait
            } else {
                Decision::Select {
                    pod: None,
                    outcome: Outcome::NoChoice,
                }
            };
        };
        let Some(chosen) = self.chosen(&pod) else {
            if pod.deleting {
                return self.select(&mut state, pod, Outcome::Deleting);
            }
            if await_choice.schedulers.contains(&pod.scheduler) {
                if may_wait {
                    return Decision::Wait;
                }
                return self.select(&mut state, pod, Outcome::NoChoiceInTime { waited });
            }
            return self.select(&mut state, pod, Outcome::NoChoice);
        };
        let by_huawei = chosen.annotation != annotation::DEVICES_ANNOTATION;
        let chosen = match chosen.devices {
            Ok(ids) if ids.is_empty() => return self.select(&mut state, pod, Outcome::NoChoice),
            Ok(ids) => ids,
            Err(reason) => {
                let annotation = chosen.annotation;
                return self.select(&mut state, pod, Outcome::Invalid { annotation, reason });
            }
        };
        let next = self.next_of(&state, &pod, &chosen, req.size);
        let reason = if next.len() < req.size {
            Some(format!(
                "the container needs {} devices, {} of the choice are left",
                req.size,
                next.len()
            ))
        } else if let Some(taken) = next.iter().find(|id| !req.available.contains(id)) {
            Some(format!("{taken} is not available (in use or unhealthy)"))
        } else if let Some((id, other)) = by_huawei
            .then(|| self.promised_by_fumarole(&state, pods, &pod.uid))
            .and_then(|promised| {
                next.iter()
                    .find_map(|id| promised.get(id).map(|other| (id.clone(), other.clone())))
            })
        {
            // Huawei's annotation is written by a scheduler fumarole does not keep a ledger
            // for: it never takes what fumarole's choice promised another waiting pod.
            Some(format!(
                "{id} is promised to pod {other} by its fumarole.dev/devices choice"
            ))
        } else {
            req.must_include
                .iter()
                .find(|m| !next.contains(m))
                .map(|m| format!("the kubelet must include {m}"))
        };
        if let Some(reason) = reason {
            return self.select(&mut state, pod, Outcome::NotHonoured { chosen, reason });
        }
        state.preferred.insert(
            pod.uid.clone(),
            Preferred {
                pod: pod.clone(),
                devices: next.clone(),
                from_choice: true,
            },
        );
        Decision::Prefer { pod, devices: next }
    }

    /// The first `size` devices of `chosen` the pod has not got yet: containers take the chosen
    /// devices in order.
    fn next_of(
        &self,
        state: &State,
        pod: &BoundPod,
        chosen: &[String],
        size: usize,
    ) -> Vec<String> {
        let given: BTreeSet<&String> = state
            .allocated
            .get(&pod.uid)
            .into_iter()
            .flatten()
            .chain(pod.reported.get(&self.resource).into_iter().flatten())
            .collect();
        chosen
            .iter()
            .filter(|id| !given.contains(id))
            .take(size)
            .cloned()
            .collect()
    }

    fn select(&self, state: &mut State, pod: BoundPod, outcome: Outcome) -> Decision {
        state.preferred.insert(
            pod.uid.clone(),
            Preferred {
                pod: pod.clone(),
                devices: Vec::new(),
                from_choice: false,
            },
        );
        Decision::Select {
            pod: Some(pod),
            outcome,
        }
    }

    /// Records `Allocate`'s devices for the pod being admitted (found in `pods` by the same
    /// rule as [`Self::decide`]). Returns the pod and, when the pod had a choice, how it ended:
    /// [`Outcome::Honoured`], or [`Outcome::Differs`] when the kubelet took other devices than
    /// the plugin preferred for that pod. Without a preference for it (the kubelet skips
    /// `GetPreferredAllocation` when it has no choice to make) its choice, if valid, is what the
    /// devices are checked against.
    pub fn allocated(
        &self,
        pods: &[BoundPod],
        devices: &[String],
    ) -> Option<(BoundPod, Option<Outcome>)> {
        let mut state = self.state();
        let pod = self.admitting(&state, pods, devices.len())?;
        let preferred = match state.preferred.remove(&pod.uid) {
            Some(p) => p,
            None => {
                let chosen = self
                    .chosen(&pod)
                    .and_then(|c| c.devices.ok())
                    .unwrap_or_default();
                let devices = self.next_of(&state, &pod, &chosen, devices.len());
                Preferred {
                    from_choice: !devices.is_empty(),
                    pod,
                    devices,
                }
            }
        };
        state
            .allocated
            .entry(preferred.pod.uid.clone())
            .or_default()
            .extend(devices.iter().cloned());
        let same = {
            let a: BTreeSet<&String> = devices.iter().collect();
            let b: BTreeSet<&String> = preferred.devices.iter().collect();
            a == b
        };
        let outcome = match (preferred.from_choice, same) {
            (true, true) => Some(Outcome::Honoured {
                devices: devices.to_vec(),
            }),
            (true, false) => Some(Outcome::Differs {
                preferred: preferred.devices,
                allocated: devices.to_vec(),
            }),
            _ => None,
        };
        Some((preferred.pod, outcome))
    }

    /// Devices of this resource the scheduler chose for the other pods waiting on this node
    /// (bound, not started, not `except`), and not given to them yet: when the plugin chooses
    /// on its own it keeps off these where it can, so one pod's fallback does not take the
    /// next pod's choice and cascade.
    pub fn spoken_for(&self, pods: &[BoundPod], except: Option<&str>) -> BTreeSet<String> {
        let state = self.state();
        self.promises(&state, pods, except)
            .flat_map(|(_, _, devices)| devices)
            .collect()
    }

    /// The devices fumarole's own choice (`fumarole.dev/devices`) promised the other pods
    /// waiting on this node, each with its pod (`namespace/name`).
    fn promised_by_fumarole(
        &self,
        state: &State,
        pods: &[BoundPod],
        except: &str,
    ) -> BTreeMap<String, String> {
        self.promises(state, pods, Some(except))
            .filter(|(_, annotation, _)| annotation == annotation::DEVICES_ANNOTATION)
            .flat_map(|(p, _, devices)| {
                let pod = format!("{}/{}", p.namespace, p.name);
                devices.into_iter().map(move |id| (id, pod.clone()))
            })
            .collect()
    }

    /// For each pod waiting on this node (bound, not started, not `except`) with a valid
    /// choice: the pod, the annotation that chose, and the chosen devices not given it yet.
    fn promises<'a>(
        &'a self,
        state: &'a State,
        pods: &'a [BoundPod],
        except: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a BoundPod, String, Vec<String>)> + 'a {
        pods.iter()
            .filter(move |p| !p.started && Some(p.uid.as_str()) != except)
            .filter_map(move |p| {
                let chosen = self.chosen(p)?;
                let ids = chosen.devices.ok()?;
                let wants = p.requests.get(&self.resource).copied().unwrap_or(0) as usize;
                let held = self.held(state, p);
                let next = self.next_of(state, p, &ids, wants.saturating_sub(held));
                Some((p, chosen.annotation, next))
            })
    }

    /// Checks this plugin's account of which pod holds which devices against the kubelet's
    /// own, PodResources ([`BoundPod::reported`]): `Allocate` does not name its pod, so the
    /// plugin matches it by watch order ([`Self::allocated`]), and a wrong match would make
    /// it count devices for a pod that does not have them (and wait for, or prefer, the wrong
    /// ones). A device the kubelet reports for a pod not finished or being deleted (a
    /// finished one's report may be stale: the kubelet frees its devices) but this plugin
    /// counted for another pod is moved to the kubelet's pod. Answers each such pod with
    /// [`Outcome::Misattributed`].
    pub fn reconcile(&self, pods: &[BoundPod]) -> Vec<(BoundPod, Outcome)> {
        let mut state = self.state();
        let mut out = Vec::new();
        for pod in pods.iter().filter(|p| !p.finished && !p.deleting) {
            let Some(reported) = pod.reported.get(&self.resource) else {
                continue;
            };
            for other in pods.iter().filter(|o| o.uid != pod.uid) {
                let Some(counted) = state.allocated.get_mut(&other.uid) else {
                    continue;
                };
                let moved: Vec<String> = counted
                    .iter()
                    .filter(|d| reported.contains(d))
                    .cloned()
                    .collect();
                if moved.is_empty() {
                    continue;
                }
                counted.retain(|d| !moved.contains(d));
                let held = state.allocated.entry(pod.uid.clone()).or_default();
                for d in &moved {
                    if !held.contains(d) {
                        held.push(d.clone());
                    }
                }
                out.push((
                    pod.clone(),
                    Outcome::Misattributed {
                        devices: moved,
                        counted_for: other.to_string(),
                    },
                ));
            }
        }
        out
    }

    /// Forgets pods that are gone from `pods` (deleted, or finished and removed).
    pub fn retain(&self, pods: &[BoundPod]) {
        let live: BTreeSet<&str> = pods.iter().map(|p| p.uid.as_str()).collect();
        let mut state = self.state();
        state.allocated.retain(|uid, _| live.contains(uid.as_str()));
        state.preferred.retain(|uid, _| live.contains(uid.as_str()));
    }
}

/// A choice naming `count` devices of `resource` must be for a resource the pod requests, and
/// no more devices than it requests.
fn check_count(pod: &BoundPod, resource: &str, count: usize) -> Result<(), String> {
    let asked = pod.requests.get(resource).copied().unwrap_or(0);
    if asked == 0 {
        return Err(format!(
            "it names {resource}, which the pod does not request"
        ));
    }
    if count as u64 > asked {
        return Err(format!(
            "it names {count} {resource} devices, the pod requests {asked}"
        ));
    }
    Ok(())
}

fn same_set(a: &[String], b: &[String]) -> bool {
    a.iter().collect::<BTreeSet<_>>() == b.iter().collect::<BTreeSet<_>>()
}

#[cfg(test)]
mod tests;
