//! Huawei Ascend's pod annotations, as fumarole reads and writes them to interoperate with
//! Huawei's Volcano plugin and device plugin (facts: `shared/reference/ascend-contract.md`).
//!
//! - `huawei.com/<Chip>` (e.g. `huawei.com/Ascend910`, keyed by the resource name): the NPUs
//!   Huawei's scheduler plugin chose, as device names `<Chip>-<physical id>` joined by commas
//!   (`"Ascend910-2,Ascend910-3"`). fumarole's device plugin honours it like
//!   `fumarole.dev/devices`; fumarole's extension writes it beside its own choice, so Huawei's
//!   device plugin, if it served the node instead, would hand out the same NPUs.
//! - `huawei.com/AscendReal`: the NPUs actually mounted, same format; written by the agent
//!   after `Allocate`.
//! - `predicate-time`: Unix nanoseconds, written by Huawei's plugin; read by nobody here
//!   (fumarole finds the pod being admitted by watch order, see the device plugin's admission).
//! - For the training job ([`job_annotations`]), written by Huawei's plugin at allocation and by
//!   fumarole's extension beside its choice: `hccl/rankIndex` (the pod's rank in its job),
//!   and for the pods of a super-pod (`sp-block`) job `super-pod-rank` (the index of the pod's
//!   logical super-pod in the job) and `super-pod-id` (the physical super-pod's `SuperPodID`).
//!   All three are decimal integers, as Huawei writes them (`strconv.Itoa`); Huawei's
//!   ascend-operator reads `super-pod-rank` into the job's environment.
//! - `fumarole.dev/job-annotations` ([`WRITTEN_JOB_ANNOTATIONS`]): which of those three keys
//!   fumarole's extension added to the pod (comma-separated). While the pod is not bound they
//!   are the extension's to replace or remove (a placement that did not bind); a value it did
//!   not add is someone else's and stands. The extension's admission policy holds it to that.
//!
//! Start at [`parse`] and [`format`].

use std::collections::{BTreeMap, BTreeSet};

/// Prefix of the per-resource choice annotations (and of Ascend resource names).
pub const RESOURCE_PREFIX: &str = "huawei.com/";

/// The NPUs actually mounted into the pod.
pub const ASCEND_REAL_ANNOTATION: &str = "huawei.com/AscendReal";

/// Unix nanoseconds of Huawei's scheduling decision.
pub const PREDICATE_TIME_ANNOTATION: &str = "predicate-time";

/// The chip of an Ascend resource name (`huawei.com/Ascend910` -> `Ascend910`): the prefix
/// of its device names. `None` for other resources and for `huawei.com/AscendReal`.
pub fn chip_of(resource: &str) -> Option<&str> {
    let chip = resource.strip_prefix(RESOURCE_PREFIX)?;
    let ok = chip.starts_with("Ascend")
        && chip.len() > "Ascend".len()
        && resource != ASCEND_REAL_ANNOTATION
        && chip.chars().all(|c| c.is_ascii_alphanumeric());
    ok.then_some(chip)
}

/// The pod's rank in its job (HCCL's rank table).
pub const RANK_INDEX_ANNOTATION: &str = "hccl/rankIndex";

/// The index of the pod's logical super-pod (`sp-block`) within its job.
pub const SUPER_POD_RANK_ANNOTATION: &str = "super-pod-rank";

/// The id of the physical super-pod the pod's node is in (`SuperPodID`).
pub const SUPER_POD_ID_ANNOTATION: &str = "super-pod-id";

/// The job annotations fumarole's extension added to a pod (their keys, comma-separated).
pub const WRITTEN_JOB_ANNOTATIONS: &str = "fumarole.dev/job-annotations";

/// The keys [`WRITTEN_JOB_ANNOTATIONS`] lists in `annotations`: job annotation keys only
/// (anything else in it is ignored).
pub fn written_job_keys(annotations: &BTreeMap<String, String>) -> BTreeSet<&'static str> {
    let listed = annotations
        .get(WRITTEN_JOB_ANNOTATIONS)
        .map(String::as_str)
        .unwrap_or_default();
    JOB_ANNOTATION_KEYS
        .into_iter()
        .filter(|k| listed.split(',').any(|l| l.trim() == *k))
        .collect()
}

/// The keys of the job annotations ([`job_annotations`]).
pub const JOB_ANNOTATION_KEYS: [&str; 3] = [
    RANK_INDEX_ANNOTATION,
    SUPER_POD_RANK_ANNOTATION,
    SUPER_POD_ID_ANNOTATION,
];

/// Where a pod of a super-pod job landed: its logical super-pod and the physical one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuperPodPlace {
    /// Index of the logical super-pod in the job: `rank x NPUs per pod / sp-block`.
    pub logical: u32,
    /// `SuperPodID` of the node's physical super-pod, when its super-node id is one
    /// ([`super_pod_id`]).
    pub physical: Option<u32>,
}

/// The physical super-pod id of a super-node id: Huawei's `SuperPodID` is a non-negative
/// integer, so only an id that is one names it (the rule the node side applies when it
/// writes `SuperPodID` into the device-info ConfigMap).
pub fn super_pod_id(super_node: &str) -> Option<u32> {
    let id = super_node.trim();
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()))
        .then(|| id.parse().ok())
        .flatten()
}

/// The annotations a training job reads, as Huawei's scheduler plugin writes them:
/// `hccl/rankIndex` when the rank is known, and for a pod of a super-pod job `super-pod-rank`,
/// with `super-pod-id` when the physical super-pod's id is known.
pub fn job_annotations(
    rank: Option<u32>,
    super_pod: Option<SuperPodPlace>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Some(rank) = rank {
        out.insert(RANK_INDEX_ANNOTATION.to_string(), rank.to_string());
    }
    if let Some(place) = super_pod {
        out.insert(
            SUPER_POD_RANK_ANNOTATION.to_string(),
            place.logical.to_string(),
        );
        if let Some(id) = place.physical {
            out.insert(SUPER_POD_ID_ANNOTATION.to_string(), id.to_string());
        }
    }
    out
}

/// Why an Ascend device list is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AscendError {
    #[error("the device list is empty")]
    Empty,
    #[error("{0:?} is not a device name <Chip>-<physical id>")]
    BadName(String),
    #[error("{name:?} is not an {chip} device")]
    WrongChip { name: String, chip: String },
    #[error("{0:?} is listed twice")]
    Duplicate(String),
}

/// Parses a device list of `chip` (`"Ascend910-2,Ascend910-3"`) into physical ids, in order.
/// Spaces around names are allowed; anything else unexpected is an error.
pub fn parse(chip: &str, value: &str) -> Result<Vec<u32>, AscendError> {
    if value.trim().is_empty() {
        return Err(AscendError::Empty);
    }
    let mut seen = BTreeSet::new();
    let mut ids = Vec::new();
    for name in value.split(',').map(str::trim) {
        let (prefix, id) = name
            .rsplit_once('-')
            .ok_or_else(|| AscendError::BadName(name.to_string()))?;
        // Digits only: `u32::from_str` would take a leading '+'.
        let chip_like = !prefix.is_empty() && prefix.bytes().all(|b| b.is_ascii_alphanumeric());
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) || !chip_like {
            return Err(AscendError::BadName(name.to_string()));
        }
        let id: u32 = id
            .parse()
            .map_err(|_| AscendError::BadName(name.to_string()))?;
        if prefix != chip {
            return Err(AscendError::WrongChip {
                name: name.to_string(),
                chip: chip.to_string(),
            });
        }
        if !seen.insert(id) {
            return Err(AscendError::Duplicate(name.to_string()));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// The device name of physical id `id` of `chip` (`Ascend910-3`).
pub fn name(chip: &str, id: u32) -> String {
    format!("{chip}-{id}")
}

/// A device list of `chip`, as Huawei writes it.
pub fn format(chip: &str, ids: impl IntoIterator<Item = u32>) -> String {
    ids.into_iter()
        .map(|id| name(chip, id))
        .collect::<Vec<_>>()
        .join(",")
}

/// The `huawei.com/<Chip>` annotations that say what a `fumarole.dev/devices` choice (resource
/// -> device ids) says, so Huawei's device plugin would hand out the same NPUs: one per Ascend
/// resource of the choice whose ids are Huawei's names, which fumarole's Ascend ids are
/// (`<Chip>-<davinci number>`, the physical id) unless a device-plugin config renamed the
/// resource. Other resources, and ids of another form, get none.
pub fn from_choice(choice: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, String> {
    choice
        .iter()
        .filter_map(|(resource, ids)| {
            let chip = chip_of(resource)?;
            let physical = parse(chip, &ids.join(",")).ok()?;
            Some((resource.clone(), format(chip, physical)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn job_annotations_are_decimal_like_huaweis() {
        assert_eq!(job_annotations(None, None), BTreeMap::new());
        let a = job_annotations(
            Some(5),
            Some(SuperPodPlace {
                logical: 2,
                physical: Some(7),
            }),
        );
        assert_eq!(
            a,
            BTreeMap::from([
                ("hccl/rankIndex".to_string(), "5".to_string()),
                ("super-pod-id".to_string(), "7".to_string()),
                ("super-pod-rank".to_string(), "2".to_string()),
            ])
        );
        assert_eq!(job_annotations(Some(0), None).len(), 1);
        let unnumbered = job_annotations(
            None,
            Some(SuperPodPlace {
                logical: 0,
                physical: None,
            }),
        );
        assert_eq!(
            unnumbered,
            BTreeMap::from([("super-pod-rank".to_string(), "0".to_string())])
        );
        assert_eq!(super_pod_id("7"), Some(7));
        assert_eq!(super_pod_id(" 12 "), Some(12));
        for not_an_id in ["sp-1", "", "-1", "+3", "4294967296", "1.5"] {
            assert_eq!(super_pod_id(not_an_id), None, "{not_an_id:?}");
        }
    }

    #[test]
    fn chips_of_resources() {
        assert_eq!(chip_of("huawei.com/Ascend910"), Some("Ascend910"));
        assert_eq!(chip_of("huawei.com/Ascend310P"), Some("Ascend310P"));
        assert_eq!(chip_of("huawei.com/AscendReal"), None);
        assert_eq!(chip_of("huawei.com/Ascend"), None);
        assert_eq!(chip_of("huawei.com/Ascend910-Unhealthy"), None);
        assert_eq!(chip_of("nvidia.com/gpu"), None);
        assert_eq!(chip_of("huawei.com/npu"), None);
    }

    #[test]
    fn parses_lists_in_order() {
        assert_eq!(
            parse("Ascend910", "Ascend910-2,Ascend910-3").unwrap(),
            [2, 3]
        );
        assert_eq!(
            parse("Ascend910", " Ascend910-7 , Ascend910-0").unwrap(),
            [7, 0]
        );
        assert_eq!(parse("Ascend310P", "Ascend310P-1").unwrap(), [1]);
        let v = format("Ascend910", [4, 5]);
        assert_eq!(v, "Ascend910-4,Ascend910-5");
        assert_eq!(parse("Ascend910", &v).unwrap(), [4, 5]);
    }

    #[test]
    fn rejects_garbled_lists() {
        use AscendError::*;
        let p = |v: &str| parse("Ascend910", v);
        assert_eq!(p(""), Err(Empty));
        assert_eq!(p("  "), Err(Empty));
        assert_eq!(p("Ascend910-2,"), Err(BadName(String::new())));
        assert_eq!(p("Ascend910-2,,Ascend910-3"), Err(BadName(String::new())));
        assert_eq!(p("npu2"), Err(BadName("npu2".into())));
        assert_eq!(p("Ascend910-"), Err(BadName("Ascend910-".into())));
        assert_eq!(p("-2"), Err(BadName("-2".into())));
        assert_eq!(p("Ascend910-+2"), Err(BadName("Ascend910-+2".into())));
        assert_eq!(p("Ascend910--2"), Err(BadName("Ascend910--2".into())));
        assert_eq!(p("Ascend910-x"), Err(BadName("Ascend910-x".into())));
        assert_eq!(
            p("Ascend910-99999999999"),
            Err(BadName("Ascend910-99999999999".into()))
        );
        assert_eq!(
            p("Ascend910-2,Ascend910-2"),
            Err(Duplicate("Ascend910-2".into()))
        );
        assert_eq!(
            p("Ascend910-2;Ascend910-3"),
            Err(BadName("Ascend910-2;Ascend910-3".into()))
        );
        assert_eq!(
            p("Ascend310P-1"),
            Err(WrongChip {
                name: "Ascend310P-1".into(),
                chip: "Ascend910".into()
            })
        );
        assert_eq!(
            p(r#"["Ascend910-1"]"#),
            Err(BadName(r#"["Ascend910-1"]"#.into()))
        );
    }

    #[test]
    fn choices_become_huawei_annotations_only_where_names_fit() {
        let choice = BTreeMap::from([
            (
                "huawei.com/Ascend910".to_string(),
                vec!["Ascend910-3".into(), "Ascend910-2".into()],
            ),
            ("huawei.com/Ascend310P".to_string(), vec!["npu-1".into()]),
            ("nvidia.com/gpu".to_string(), vec!["GPU-0".into()]),
        ]);
        assert_eq!(
            from_choice(&choice),
            BTreeMap::from([(
                "huawei.com/Ascend910".to_string(),
                "Ascend910-3,Ascend910-2".to_string()
            )])
        );
        assert!(from_choice(&BTreeMap::new()).is_empty());
    }

    #[test]
    fn written_job_keys_are_job_annotation_keys_only() {
        let with = |v: &str| BTreeMap::from([(WRITTEN_JOB_ANNOTATIONS.to_string(), v.to_string())]);
        assert_eq!(
            written_job_keys(&with("super-pod-id, hccl/rankIndex")),
            BTreeSet::from([RANK_INDEX_ANNOTATION, SUPER_POD_ID_ANNOTATION])
        );
        assert!(written_job_keys(&with("team,fumarole.dev/devices,,")).is_empty());
        assert!(written_job_keys(&BTreeMap::new()).is_empty());
    }

    #[test]
    fn never_panics_on_arbitrary_input() {
        for v in [
            "\u{0}",
            "é-1",
            "-",
            ",",
            "Ascend910-1-2",
            "Ascend910-٣",
            "a-b-c,d",
        ] {
            let _ = parse("Ascend910", v);
        }
    }
}
