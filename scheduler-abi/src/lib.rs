//! fumarole's decision core behind a C ABI, for the scheduler plugins compiled into upstream
//! schedulers (`volcano-plugin/`, `kube-plugin/`, through the cgo binding in `go/`): the Go side
//! hands over objects as JSON and reads answers; it decides nothing. The declarations are in
//! `include/fumarole_scheduler.h`.
//!
//! Every function catches panics at this edge (a panic unwinding into Go would stop the whole
//! scheduler) and answers with a [status code](FUMAROLE_OK) and, where there is one, a message
//! or result string the caller frees with [`fumarole_string_free`].
//!
//! One call judges a task on every node ([`fumarole_task_evaluate_arrays`], the plugins' call;
//! [`fumarole_task_evaluate`] gives the same as text); the plugins answer the
//! schedulers' per-node questions (Volcano's predicate and node order, kube-scheduler's Filter
//! and Score) from that result, with no call here per node. [`fumarole_task_allocate`] /
//! [`fumarole_task_deallocate`] move devices in and out of the ledger as the scheduler
//! allocates (reserves) and undoes; [`fumarole_task_bind`] binds with the choice.

pub mod engine;
pub mod kube_conf;
pub mod volcano_conf;

use std::ffi::{CString, c_char, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::core::v1::Pod;

use crate::engine::{Engine, EngineConfig, Evaluation};

/// Done; `*out` (where given) holds the result, or NULL.
pub const FUMAROLE_OK: c_int = 0;
/// The task asks for no device fumarole serves: pass it through.
pub const FUMAROLE_NOT_OURS: c_int = 1;
/// Refused: bad input or a decision against it; `*out` holds why.
pub const FUMAROLE_ERROR: c_int = 2;
/// A bug: fumarole panicked, and the panic was stopped here; `*out` holds the message.
pub const FUMAROLE_PANIC: c_int = 3;

/// Starts the engine from a JSON [`EngineConfig`] and waits for its first view. NULL on
/// failure, with why in `*error`. The engine lives until [`fumarole_engine_free`].
///
/// # Safety
/// `config` points to `len` readable bytes; `error` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_engine_start(
    config: *const u8,
    len: usize,
    error: *mut *mut c_char,
) -> *mut Engine {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        new_engine(error, || {
            let config: EngineConfig = serde_json::from_slice(bytes(config, len)?)
                .context("fumarole engine configuration")?;
            start_logging();
            Engine::start(&config)
        })
    }
}

/// An engine over the view a directory of YAML objects gives (what `serve
/// --cluster-snapshot` reads), with no API server: for tests and benches of the ABI. `conf` is
/// the JSON configuration [`fumarole_engine_start`] takes (its API server fields unused).
///
/// # Safety
/// `dir` and `conf` point to `dir_len` and `conf_len` readable bytes; `error` is NULL or
/// writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_engine_over_snapshot(
    dir: *const u8,
    dir_len: usize,
    conf: *const u8,
    conf_len: usize,
    error: *mut *mut c_char,
) -> *mut Engine {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        new_engine(error, || {
            let dir = std::str::from_utf8(bytes(dir, dir_len)?).context("snapshot path")?;
            let conf = serde_json::from_slice(bytes(conf, conf_len)?)
                .context("fumarole engine configuration")?;
            let view = scheduler_ext::snapshot::load(std::path::Path::new(dir))?;
            Engine::over_view(view, &conf)
        })
    }
}

/// The configuration's arguments fumarole does not implement, one per line (for the
/// scheduler's log, once), or NULL when there are none.
///
/// # Safety
/// `engine` comes from a start function and was not freed; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_engine_notes(
    engine: *const Engine,
    out: *mut *mut c_char,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        edge(out, || {
            let notes = engine_ref(engine)?.notes();
            Ok((FUMAROLE_OK, (!notes.is_empty()).then(|| notes.join("\n"))))
        })
    }
}

/// Judges the pod (JSON) on every node: [`FUMAROLE_OK`] with, in `*out`, lines separated by
/// TABs: `G generation` (names the view's node order); when `known_generation` is another,
/// `N name` for every node in that order; the distinct reasons (`R text`); then one line per
/// node in that order (`code score reason`: code 0 fits, 2 unschedulable, 3 unresolvable;
/// reason the index of an `R` line, empty where the node fits). Or [`FUMAROLE_NOT_OURS`], or
/// [`FUMAROLE_ERROR`] with why the pod's request is unusable. Pass 0 to get the names (a view
/// of no nodes has generation 0, and no names to send).
///
/// # Safety
/// `engine` is live; `pod` points to `len` readable bytes; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_task_evaluate(
    engine: *const Engine,
    pod: *const u8,
    len: usize,
    known_generation: u64,
    out: *mut *mut c_char,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        edge(out, || {
            let engine = engine_ref(engine)?;
            match engine.evaluate(&parse_pod(pod, len)?, known_generation)? {
                Evaluation::NotOurs => Ok((FUMAROLE_NOT_OURS, None)),
                Evaluation::Verdicts(table) => Ok((FUMAROLE_OK, Some(table.text()))),
            }
        })
    }
}

/// A task's verdicts per node as arrays of `len` entries, in the order of the view's nodes
/// ([`fumarole_task_evaluate_arrays`]); the library owns them until [`fumarole_verdicts_free`].
#[repr(C)]
#[derive(Debug)]
pub struct FumaroleVerdicts {
    pub len: usize,
    /// 0 fits, 2 unschedulable, 3 unresolvable.
    pub codes: *mut u8,
    /// The score on Volcano's scale; 0 where the node does not fit.
    pub scores: *mut f64,
    /// The index of the node's reason among the `R` lines, -1 where it fits.
    pub reasons: *mut i32,
}

impl FumaroleVerdicts {
    const EMPTY: FumaroleVerdicts = FumaroleVerdicts {
        len: 0,
        codes: std::ptr::null_mut(),
        scores: std::ptr::null_mut(),
        reasons: std::ptr::null_mut(),
    };
}

/// [`fumarole_task_evaluate`] with the per-node verdicts in arrays rather than text lines: at
/// thousands of nodes a task, writing and reading a number per line was a tenth of a
/// scheduler's CPU. [`FUMAROLE_OK`] with, in `*out`, the `G`, `N` and `R` lines of
/// [`fumarole_task_evaluate`] (none per node) and, in `*verdicts`, the arrays, which the caller
/// frees with [`fumarole_verdicts_free`]; on any other code `*verdicts` is empty.
///
/// # Safety
/// `engine` is live; `pod` points to `len` readable bytes; `out` and `verdicts` are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_task_evaluate_arrays(
    engine: *const Engine,
    pod: *const u8,
    len: usize,
    known_generation: u64,
    out: *mut *mut c_char,
    verdicts: *mut FumaroleVerdicts,
) -> c_int {
    if verdicts.is_null() {
        // SAFETY: the caller's contract, passed on.
        return unsafe { edge(out, || Err(anyhow!("NULL verdicts"))) };
    }
    // SAFETY: `verdicts` is writable (the caller's contract).
    unsafe { verdicts.write(FumaroleVerdicts::EMPTY) };
    // SAFETY: the caller's contract, passed on.
    unsafe {
        edge(out, || {
            let engine = engine_ref(engine)?;
            match engine.evaluate(&parse_pod(pod, len)?, known_generation)? {
                Evaluation::NotOurs => Ok((FUMAROLE_NOT_OURS, None)),
                Evaluation::Verdicts(table) => {
                    // Boxed slices, so each array is freed with the length it was made with.
                    verdicts.write(FumaroleVerdicts {
                        len: table.codes.len(),
                        codes: Box::into_raw(table.codes.into_boxed_slice()).cast(),
                        scores: Box::into_raw(table.scores.into_boxed_slice()).cast(),
                        reasons: Box::into_raw(table.reasons.into_boxed_slice()).cast(),
                    });
                    Ok((FUMAROLE_OK, Some(table.header)))
                }
            }
        })
    }
}

/// Frees the arrays of [`fumarole_task_evaluate_arrays`] and empties `*verdicts` (so a second
/// call frees nothing).
///
/// # Safety
/// `verdicts` is NULL or holds what [`fumarole_task_evaluate_arrays`] wrote, not freed since.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_verdicts_free(verdicts: *mut FumaroleVerdicts) {
    if verdicts.is_null() {
        return;
    }
    // SAFETY: the caller's contract: the arrays are `len` long, boxed here, not freed since.
    unsafe {
        let v = verdicts.replace(FumaroleVerdicts::EMPTY);
        if v.len == 0 {
            return;
        }
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            v.codes, v.len,
        )));
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            v.scores, v.len,
        )));
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            v.reasons, v.len,
        )));
    }
}

/// The scheduler allocated the pod (JSON) to `node`: [`FUMAROLE_OK`] (devices recorded),
/// [`FUMAROLE_NOT_OURS`], or [`FUMAROLE_ERROR`] with why the node cannot hold it.
///
/// # Safety
/// `engine` is live; `pod` and `node` point to `len` and `node_len` readable bytes; `error`
/// is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_task_allocate(
    engine: *const Engine,
    pod: *const u8,
    len: usize,
    node: *const u8,
    node_len: usize,
    error: *mut *mut c_char,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        pod_on_node(
            engine,
            pod,
            len,
            node,
            node_len,
            error,
            |engine, pod, node| engine.allocate(pod, node),
        )
    }
}

/// The scheduler undid the pod's (JSON) allocation: [`FUMAROLE_OK`] (devices released) or
/// [`FUMAROLE_NOT_OURS`] (none were held).
///
/// # Safety
/// As [`fumarole_task_evaluate`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_task_deallocate(
    engine: *const Engine,
    pod: *const u8,
    len: usize,
    error: *mut *mut c_char,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        edge(error, || {
            let held = engine_ref(engine)?.deallocate(&parse_pod(pod, len)?);
            Ok((if held { FUMAROLE_OK } else { FUMAROLE_NOT_OURS }, None))
        })
    }
}

/// The scheduler's other filters refused every node fumarole found fit for the pod (JSON),
/// a taint on every node of its unit's super-node, say: the unit's plan is given up and that
/// super-node avoided for it for a while, so the next try plans it elsewhere.
/// [`FUMAROLE_OK`] with the super-node given up in `*out`, or NULL when there was nothing to
/// give up (no unit, no plan, or the unit has started there); [`FUMAROLE_ERROR`] with why the
/// pod's request is unusable.
///
/// # Safety
/// As [`fumarole_task_evaluate`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_task_give_up_plan(
    engine: *const Engine,
    pod: *const u8,
    len: usize,
    out: *mut *mut c_char,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        edge(out, || {
            let given_up = engine_ref(engine)?.give_up_plan(&parse_pod(pod, len)?)?;
            Ok((FUMAROLE_OK, given_up))
        })
    }
}

/// The scheduler is binding the pod (JSON) to `node` and has no hook that waits (Volcano v1.10,
/// at the close of the session that bound it): writes its device choice in the background.
/// [`FUMAROLE_OK`], [`FUMAROLE_NOT_OURS`] (nothing of ours, or its choice for `node` is
/// already written), or [`FUMAROLE_ERROR`] with why the node cannot hold it. Call [`fumarole_engine_write_choices_at_prebind`] first, so allocations write nothing.
///
/// # Safety
/// As [`fumarole_task_allocate`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_task_write_choice(
    engine: *const Engine,
    pod: *const u8,
    len: usize,
    node: *const u8,
    node_len: usize,
    error: *mut *mut c_char,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        pod_on_node(
            engine,
            pod,
            len,
            node,
            node_len,
            error,
            |engine, pod, node| engine.write_choice(pod, node),
        )
    }
}

/// The scheduler will say when each pod is bound ([`fumarole_task_prebind`] or
/// [`fumarole_task_bind`] before the bind, [`fumarole_task_write_choice`] as it binds):
/// allocations no longer write device choices themselves. [`FUMAROLE_OK`].
///
/// # Safety
/// `engine` is live; `error` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_engine_write_choices_at_prebind(
    engine: *const Engine,
    error: *mut *mut c_char,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        edge(error, || {
            engine_ref(engine)?.write_choices_at_prebind();
            Ok((FUMAROLE_OK, None))
        })
    }
}

/// The scheduler is about to bind the pod (JSON) to `node`: writes its device choice on the
/// pod and returns once the API server took it. [`FUMAROLE_OK`] (written: bind),
/// [`FUMAROLE_NOT_OURS`], or [`FUMAROLE_ERROR`] with why (do not bind). Waits up to 10 s.
///
/// # Safety
/// As [`fumarole_task_allocate`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_task_prebind(
    engine: *const Engine,
    pod: *const u8,
    len: usize,
    node: *const u8,
    node_len: usize,
    error: *mut *mut c_char,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        pod_on_node(
            engine,
            pod,
            len,
            node,
            node_len,
            error,
            |engine, pod, node| engine.prebind(&pod, node),
        )
    }
}

/// kube-scheduler binds the pod (JSON) to `node` through the plugin: creates its Binding with
/// the device choice in its annotations. [`FUMAROLE_OK`] (bound), [`FUMAROLE_NOT_OURS`] (let
/// the default binder bind it), or [`FUMAROLE_ERROR`] with why (not bound). Waits up to 10 s.
/// Call [`fumarole_engine_write_choices_at_prebind`] first, so allocations write nothing.
///
/// # Safety
/// As [`fumarole_task_allocate`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_task_bind(
    engine: *const Engine,
    pod: *const u8,
    len: usize,
    node: *const u8,
    node_len: usize,
    error: *mut *mut c_char,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        pod_on_node(
            engine,
            pod,
            len,
            node,
            node_len,
            error,
            |engine, pod, node| engine.bind(&pod, node),
        )
    }
}

/// How many of the engine's views took in a DeviceTopology change so far (a counter that only
/// grows); 0 for NULL. A scheduler plugin retries the pods fumarole refused when it moves.
///
/// # Safety
/// `engine` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_engine_device_views(engine: *const Engine) -> u64 {
    // SAFETY: the caller's contract, passed on.
    let Some(engine) = (unsafe { engine.as_ref() }) else {
        return 0;
    };
    catch_unwind(AssertUnwindSafe(|| engine.device_views())).unwrap_or(0)
}

/// How many times the engine's ledger gave room back so far (a reservation undone, a plan
/// dropped or lapsed; a counter that only moves forward); 0 for NULL. A scheduler plugin
/// retries the pods fumarole refused when it moves.
///
/// # Safety
/// `engine` is NULL or live.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_engine_room_freed(engine: *const Engine) -> u64 {
    // SAFETY: the caller's contract, passed on.
    let Some(engine) = (unsafe { engine.as_ref() }) else {
        return 0;
    };
    catch_unwind(AssertUnwindSafe(|| engine.room_freed())).unwrap_or(0)
}

/// Frees a string this library returned; NULL is ignored.
///
/// # Safety
/// `s` is NULL or a string from this library, not freed before.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: made by CString::into_raw in `edge`.
        drop(unsafe { CString::from_raw(s) });
    }
}

/// Stops an engine (its runtime and watches) and frees it; NULL is ignored.
///
/// # Safety
/// `engine` is NULL or from a start function, not freed before and not in use.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fumarole_engine_free(engine: *mut Engine) {
    if !engine.is_null() {
        // SAFETY: made by Box::into_raw in a start function.
        let engine = unsafe { Box::from_raw(engine) };
        let _ = catch_unwind(AssertUnwindSafe(move || drop(engine)));
    }
}

/// The calls that take a pod (JSON) and a node and answer whether the pod was ours:
/// [`FUMAROLE_OK`] when `f` says so, [`FUMAROLE_NOT_OURS`] when not, [`FUMAROLE_ERROR`] with why.
///
/// # Safety
/// As [`fumarole_task_allocate`].
unsafe fn pod_on_node(
    engine: *const Engine,
    pod: *const u8,
    len: usize,
    node: *const u8,
    node_len: usize,
    error: *mut *mut c_char,
    f: impl FnOnce(&Engine, Pod, &str) -> Result<bool>,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        edge(error, || {
            let engine = engine_ref(engine)?;
            let node = parse_node(node, node_len)?;
            let ours = f(engine, parse_pod(pod, len)?, node)?;
            Ok((if ours { FUMAROLE_OK } else { FUMAROLE_NOT_OURS }, None))
        })
    }
}

/// The engine `make` gives, boxed for C, or NULL with why in `*error` ([`edge`]).
unsafe fn new_engine(
    error: *mut *mut c_char,
    make: impl FnOnce() -> Result<Engine>,
) -> *mut Engine {
    let mut engine = std::ptr::null_mut();
    // SAFETY: the caller's contract, passed on.
    let code = unsafe {
        edge(error, || {
            engine = Box::into_raw(Box::new(make()?));
            Ok((FUMAROLE_OK, None))
        })
    };
    if code == FUMAROLE_OK {
        engine
    } else {
        std::ptr::null_mut()
    }
}

/// Runs `f` with panics stopped; writes its string (or the error, or the panic's message) to
/// `*out` where `out` is not NULL, and returns its code.
unsafe fn edge(
    out: *mut *mut c_char,
    f: impl FnOnce() -> Result<(c_int, Option<String>)>,
) -> c_int {
    let (code, text) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => (FUMAROLE_ERROR, Some(format!("{e:#}"))),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            (
                FUMAROLE_PANIC,
                Some(format!(
                    "fumarole panicked (a bug; the scheduler goes on): {what}"
                )),
            )
        }
    };
    if !out.is_null() {
        let text = text.map(|t| CString::new(t.replace('\0', " ")).unwrap_or_default());
        // SAFETY: `out` is writable (the caller's contract).
        unsafe { *out = text.map_or(std::ptr::null_mut(), CString::into_raw) };
    }
    code
}

/// The `len` bytes at `ptr` (none when `len` is 0).
unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> Result<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(anyhow!("NULL buffer of {len} bytes"));
    }
    // SAFETY: the caller's contract: `len` readable bytes at `ptr`.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

unsafe fn parse_pod(ptr: *const u8, len: usize) -> Result<Pod> {
    // SAFETY: the caller's contract, passed on.
    serde_json::from_slice(unsafe { bytes(ptr, len)? }).context("the task's pod (JSON)")
}

unsafe fn parse_node<'a>(ptr: *const u8, len: usize) -> Result<&'a str> {
    // SAFETY: the caller's contract, passed on.
    std::str::from_utf8(unsafe { bytes(ptr, len)? }).context("node name")
}

unsafe fn engine_ref<'a>(engine: *const Engine) -> Result<&'a Engine> {
    // SAFETY: NULL or a live engine (the caller's contract).
    unsafe { engine.as_ref() }.context("no fumarole engine (NULL)")
}

/// fumarole's logs go to the scheduler's stderr (`RUST_LOG`, default `info`); a subscriber
/// already set is kept.
fn start_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
