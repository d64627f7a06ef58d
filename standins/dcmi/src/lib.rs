//! A stand-in for Huawei's `libdcmi.so`, for tests without an NPU: the subset of the DCMI C
//! API fumarole calls, answering from a JSON state file the test writes and rewrites. The
//! agent loads it exactly as it loads the real library (`--dcmi-library PATH`).
//!
//! The state file is named by the `FUMAROLE_DCMI_STANDIN` environment variable and re-read
//! whenever it changes (write it whole). One entry per chip:
//!
//! ```json
//! {
//!   "chips": [
//!     {"card": 0, "device": 0, "logicId": 0, "phyId": 0,
//!      "health": 0, "errorCodes": [], "network": 0}
//!   ],
//!   "hang": ["dcmi_get_device_health"],
//!   "fail": {"dcmi_get_device_network_health": -8255}
//! }
//! ```
//!
//! `health` is `dcmi_get_device_health`'s value (0 normal .. 3 critical), `errorCodes` what
//! `dcmi_get_device_errorcode_v2` lists, `network` the `dcmi_rdfx_detect_result` of
//! `dcmi_get_device_network_health` (0 OK). `superPod`, when present, is the chip's answer to
//! `dcmi_get_device_info`'s super-pod query (`{"sdid": 0, "superPodSize": 48, "superPodId": 1,
//! "serverIndex": 5, "chassisId": 0, "superPodType": 0}`, the fields of `struct
//! dcmi_spod_info`; `superPodId` 4294967295 is "in no super-pod"); without it the chip answers
//! `DCMI_ERR_CODE_NOT_SUPPORT`, as chips other than A3 do. `chipInfo`, when present, is the
//! chip's answer to `dcmi_get_device_chip_info` (`{"chipType": "Ascend", "chipName": "910B3",
//! "chipVer": "V1", "aicoreCnt": 20}`, the fields of `struct dcmi_chip_info`; a string of 32
//! bytes or more fills its array without a NUL, as a misbehaving library would); without it
//! the chip answers `DCMI_ERR_CODE_NOT_SUPPORT`. `metrics`, when present, are the chip's
//! figures (`{"aicore": 40, "temperature": 55, "power": 1805, "aicoreFreq": 1800, "hbmTotal":
//! 65536, "hbmUsed": 1024, "hccsTx": [1.5, 0.0], "hccsRx": [2.0]}`: percent, C, tenths of a
//! watt, MHz, MB, GB/s per HCCS link, as DCMI gives them) for
//! `dcmi_get_device_utilization_rate` (AI core), `_temperature`, `_power_info`, `_frequency`
//! (AI core now), `_hbm_info` and `dcmi_get_hccs_link_bandwidth_info` (which, as the real call,
//! takes the `profiling_time` it is given; links past the lists read 0); a figure absent
//! answers `DCMI_ERR_CODE_NOT_SUPPORT`, as does another input type.
//!
//! vNPUs: `dcmi_create_vdevice` adds `{"card", "device", "vdevId", "template"}` to the file's
//! `vdevices` (the file is the driver's memory: written back whole, renamed into place), the
//! vdev id the next free from 100 (Huawei numbers vNPUs from 100) unless the caller names one;
//! a chip whose entry lists `vnpuTemplates` refuses other templates
//! (`DCMI_ERR_CODE_INVALID_PARAMETER`); `dcmi_set_destroy_vdevice` removes the entry (an id the
//! chip does not have: `DCMI_ERR_CODE_INVALID_DEVICE_ID`). `hang` blocks the named calls
//! (`"*"`: all) until the file no longer names them; `fail` makes them return that code. Cards
//! are the distinct `card` values, in order. Test code standing in for a C library: it keeps
//! the parsed file process-wide, as the real one keeps its state.

use std::ffi::{c_int, c_uint};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use serde::Deserialize;

/// The environment variable naming the state file.
pub const STATE_ENV: &str = "FUMAROLE_DCMI_STANDIN";

const OK: c_int = 0;
/// `DCMI_ERR_CODE_INVALID_PARAMETER`.
const INVALID_PARAMETER: c_int = -8001;
/// `DCMI_ERR_CODE_INVALID_DEVICE_ID`.
const INVALID_DEVICE_ID: c_int = -8007;
/// `DCMI_ERR_CODE_NOT_SUPPORT`.
const NOT_SUPPORT: c_int = -8255;
/// `DCMI_MAIN_CMD_CHIP_INF` and `DCMI_CHIP_INF_SUB_CMD_SPOD_INFO`.
const MAIN_CMD_CHIP_INF: c_int = 12;
const SUB_CMD_SPOD_INFO: c_uint = 1;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    #[serde(default)]
    chips: Vec<Chip>,
    #[serde(default)]
    hang: Vec<String>,
    #[serde(default)]
    fail: std::collections::BTreeMap<String, c_int>,
    #[serde(default)]
    vdevices: Vec<Vdevice>,
}

/// A vNPU made through the library.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Vdevice {
    card: c_int,
    device: c_int,
    vdev_id: c_uint,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Chip {
    card: c_int,
    #[serde(default)]
    device: c_int,
    logic_id: c_int,
    phy_id: c_uint,
    #[serde(default)]
    health: c_uint,
    #[serde(default)]
    error_codes: Vec<c_uint>,
    #[serde(default)]
    network: c_int,
    #[serde(default)]
    super_pod: Option<SuperPod>,
    #[serde(default)]
    chip_info: Option<ChipInfo>,
    #[serde(default)]
    metrics: Metrics,
    /// The vNPU templates the chip accepts; absent: any.
    #[serde(default)]
    vnpu_templates: Option<Vec<String>>,
}

/// A chip's figures, in DCMI's units; `None`: not supported.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Metrics {
    aicore: Option<c_uint>,
    temperature: Option<c_int>,
    power: Option<c_int>,
    aicore_freq: Option<c_uint>,
    hbm_total: Option<u64>,
    hbm_used: Option<u64>,
    hccs_tx: Option<Vec<f64>>,
    hccs_rx: Option<Vec<f64>>,
}

/// `DCMI_HCCS_MAX_PCS_NUM`.
const HCCS_LINKS: usize = 16;

/// `struct dcmi_hccs_bandwidth_info` as the API reference lays it out.
#[repr(C)]
pub struct DcmiHccsBandwidthInfo {
    profiling_time: c_int,
    total_txbw: f64,
    total_rxbw: f64,
    tx_bandwidth: [f64; HCCS_LINKS],
    rx_bandwidth: [f64; HCCS_LINKS],
}

/// `struct dcmi_hbm_info` as the header lays it out.
#[repr(C)]
pub struct DcmiHbmInfo {
    memory_size: u64,
    freq: c_uint,
    memory_usage: u64,
    temp: c_int,
    bandwith_util_rate: c_uint,
}

/// `dcmi_get_device_utilization_rate`'s AI-core input type and `dcmi_get_device_frequency`'s
/// AI-core-now type.
const AI_CORE: c_int = 2;
const AI_CORE_CURRENT_FREQ: c_int = 7;

/// `struct dcmi_chip_info`'s fields, the strings as text.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChipInfo {
    #[serde(default)]
    chip_type: String,
    #[serde(default)]
    chip_name: String,
    #[serde(default)]
    chip_ver: String,
    #[serde(default)]
    aicore_cnt: c_uint,
}

/// `MAX_CHIP_NAME_LEN`.
const CHIP_NAME_LEN: usize = 32;

/// `struct dcmi_chip_info` as the header lays it out.
#[repr(C)]
pub struct DcmiChipInfo {
    chip_type: [u8; CHIP_NAME_LEN],
    chip_name: [u8; CHIP_NAME_LEN],
    chip_ver: [u8; CHIP_NAME_LEN],
    aicore_cnt: c_uint,
}

/// `text` in a C array: NUL-terminated when it fits, else its first 32 bytes and no NUL.
fn c_array(text: &str) -> [u8; CHIP_NAME_LEN] {
    let mut a = [0u8; CHIP_NAME_LEN];
    let n = text.len().min(CHIP_NAME_LEN);
    a[..n].copy_from_slice(&text.as_bytes()[..n]);
    a
}

/// `struct dcmi_spod_info` (48 bytes: these six, then six reserved unsigned ints).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SuperPod {
    #[serde(default)]
    sdid: c_uint,
    #[serde(default)]
    super_pod_size: c_uint,
    super_pod_id: c_uint,
    #[serde(default)]
    server_index: c_uint,
    #[serde(default)]
    chassis_id: c_uint,
    #[serde(default)]
    super_pod_type: c_uint,
}

struct Loaded {
    stamp: Option<(SystemTime, u64)>,
    state: State,
}

static LOADED: Mutex<Option<Loaded>> = Mutex::new(None);

fn state() -> State {
    let Some(path) = std::env::var_os(STATE_ENV) else {
        return State::default();
    };
    let stamp = std::fs::metadata(&path)
        .ok()
        .and_then(|m| Some((m.modified().ok()?, m.len())));
    let mut loaded = LOADED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(l) = loaded.as_ref()
        && l.stamp == stamp
        && stamp.is_some()
    {
        return l.state.clone();
    }
    let parsed = std::fs::read_to_string(&path)
        .ok()
        .and_then(|text| serde_json::from_str::<State>(&text).ok());
    match parsed {
        Some(state) => {
            *loaded = Some(Loaded {
                stamp,
                state: state.clone(),
            });
            state
        }
        None => loaded.as_ref().map(|l| l.state.clone()).unwrap_or_default(),
    }
}

/// Blocks while the state names `call` under `hang`, then returns its `fail` code if any.
fn enter(call: &str) -> Option<c_int> {
    loop {
        let s = state();
        if !s.hang.iter().any(|h| h == call || h == "*") {
            return s.fail.get(call).or_else(|| s.fail.get("*")).copied();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn chip(card: c_int, device: c_int) -> Option<Chip> {
    state()
        .chips
        .into_iter()
        .find(|c| c.card == card && c.device == device)
}

macro_rules! check {
    ($call:expr) => {
        if let Some(code) = enter($call) {
            return code;
        }
    };
}

macro_rules! out {
    ($ptr:expr, $value:expr) => {{
        if $ptr.is_null() {
            return INVALID_PARAMETER;
        }
        // SAFETY: the caller passes a writable out-parameter (checked non-null).
        unsafe { *$ptr = $value };
        OK
    }};
}

/// `dcmi_init`.
#[unsafe(no_mangle)]
pub extern "C" fn dcmi_init() -> c_int {
    check!("dcmi_init");
    OK
}

/// `dcmi_get_card_num_list`.
///
/// # Safety
/// `card_num` is writable and `card_list` holds `list_len` ints.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_card_num_list(
    card_num: *mut c_int,
    card_list: *mut c_int,
    list_len: c_int,
) -> c_int {
    check!("dcmi_get_card_num_list");
    let mut cards: Vec<c_int> = state().chips.iter().map(|c| c.card).collect();
    cards.sort_unstable();
    cards.dedup();
    if card_num.is_null() || card_list.is_null() {
        return INVALID_PARAMETER;
    }
    let len = usize::try_from(list_len).unwrap_or(0);
    if cards.len() > len {
        return INVALID_PARAMETER;
    }
    // SAFETY: `card_list` holds `list_len` >= `cards.len()` ints; `card_num` is writable.
    unsafe {
        std::ptr::copy_nonoverlapping(cards.as_ptr(), card_list, cards.len());
        *card_num = c_int::try_from(cards.len()).unwrap_or(0);
    }
    OK
}

/// `dcmi_get_card_list` (newer drivers' name for the same call).
///
/// # Safety
/// As [`dcmi_get_card_num_list`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_card_list(
    card_num: *mut c_int,
    card_list: *mut c_int,
    list_len: c_int,
) -> c_int {
    // SAFETY: same contract.
    unsafe { dcmi_get_card_num_list(card_num, card_list, list_len) }
}

/// `dcmi_get_device_num_in_card`.
///
/// # Safety
/// `device_num` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_device_num_in_card(
    card_id: c_int,
    device_num: *mut c_int,
) -> c_int {
    check!("dcmi_get_device_num_in_card");
    let n = state().chips.iter().filter(|c| c.card == card_id).count();
    if n == 0 {
        return INVALID_DEVICE_ID;
    }
    out!(device_num, c_int::try_from(n).unwrap_or(0))
}

/// `dcmi_get_device_logic_id`.
///
/// # Safety
/// `logic_id` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_device_logic_id(
    logic_id: *mut c_int,
    card_id: c_int,
    device_id: c_int,
) -> c_int {
    check!("dcmi_get_device_logic_id");
    match chip(card_id, device_id) {
        Some(c) => out!(logic_id, c.logic_id),
        None => INVALID_DEVICE_ID,
    }
}

/// `dcmi_get_device_phyid_from_logicid`.
///
/// # Safety
/// `phy_id` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_device_phyid_from_logicid(
    logic_id: c_uint,
    phy_id: *mut c_uint,
) -> c_int {
    check!("dcmi_get_device_phyid_from_logicid");
    let found = state()
        .chips
        .into_iter()
        .find(|c| c_uint::try_from(c.logic_id).ok() == Some(logic_id));
    match found {
        Some(c) => out!(phy_id, c.phy_id),
        None => INVALID_DEVICE_ID,
    }
}

/// `dcmi_get_device_health`.
///
/// # Safety
/// `health` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_device_health(
    card_id: c_int,
    device_id: c_int,
    health: *mut c_uint,
) -> c_int {
    check!("dcmi_get_device_health");
    match chip(card_id, device_id) {
        Some(c) => out!(health, c.health),
        None => INVALID_DEVICE_ID,
    }
}

/// `dcmi_get_device_errorcode_v2`.
///
/// # Safety
/// `error_count` is writable and `error_code_list` holds `list_len` unsigned ints.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_device_errorcode_v2(
    card_id: c_int,
    device_id: c_int,
    error_count: *mut c_int,
    error_code_list: *mut c_uint,
    list_len: c_uint,
) -> c_int {
    check!("dcmi_get_device_errorcode_v2");
    let Some(c) = chip(card_id, device_id) else {
        return INVALID_DEVICE_ID;
    };
    if error_count.is_null() || error_code_list.is_null() {
        return INVALID_PARAMETER;
    }
    let n = c
        .error_codes
        .len()
        .min(usize::try_from(list_len).unwrap_or(0));
    // SAFETY: `error_code_list` holds `list_len` >= `n` entries; `error_count` is writable.
    unsafe {
        std::ptr::copy_nonoverlapping(c.error_codes.as_ptr(), error_code_list, n);
        *error_count = c_int::try_from(n).unwrap_or(0);
    }
    OK
}

/// `dcmi_get_device_network_health`.
///
/// # Safety
/// `result` is a writable out-parameter (a C enum).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_device_network_health(
    card_id: c_int,
    device_id: c_int,
    result: *mut c_int,
) -> c_int {
    check!("dcmi_get_device_network_health");
    match chip(card_id, device_id) {
        Some(c) => out!(result, c.network),
        None => INVALID_DEVICE_ID,
    }
}

/// `dcmi_get_device_info`: only the chip-info main command's super-pod sub command.
///
/// # Safety
/// `buf` holds `*size` writable bytes and `size` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_device_info(
    card_id: c_int,
    device_id: c_int,
    main_cmd: c_int,
    sub_cmd: c_uint,
    buf: *mut std::ffi::c_void,
    size: *mut c_uint,
) -> c_int {
    check!("dcmi_get_device_info");
    let Some(c) = chip(card_id, device_id) else {
        return INVALID_DEVICE_ID;
    };
    if main_cmd != MAIN_CMD_CHIP_INF || sub_cmd != SUB_CMD_SPOD_INFO {
        return NOT_SUPPORT;
    }
    let Some(p) = c.super_pod else {
        return NOT_SUPPORT;
    };
    let words: [c_uint; 12] = [
        p.sdid,
        p.super_pod_size,
        p.super_pod_id,
        p.server_index,
        p.chassis_id,
        p.super_pod_type,
        0,
        0,
        0,
        0,
        0,
        0,
    ];
    let bytes = std::mem::size_of_val(&words);
    if buf.is_null() || size.is_null() {
        return INVALID_PARAMETER;
    }
    // SAFETY: `size` is writable (checked non-null).
    let room = usize::try_from(unsafe { *size }).unwrap_or(0);
    if room < bytes {
        return INVALID_PARAMETER;
    }
    // SAFETY: `buf` holds `room` >= `bytes` writable bytes; `size` is writable.
    unsafe {
        std::ptr::copy_nonoverlapping(words.as_ptr().cast::<u8>(), buf.cast::<u8>(), bytes);
        *size = c_uint::try_from(bytes).unwrap_or(0);
    }
    OK
}

/// `dcmi_get_device_chip_info`.
///
/// # Safety
/// `chip_info` is a writable `struct dcmi_chip_info`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_device_chip_info(
    card_id: c_int,
    device_id: c_int,
    chip_info: *mut DcmiChipInfo,
) -> c_int {
    check!("dcmi_get_device_chip_info");
    let Some(c) = chip(card_id, device_id) else {
        return INVALID_DEVICE_ID;
    };
    let Some(info) = c.chip_info else {
        return NOT_SUPPORT;
    };
    out!(
        chip_info,
        DcmiChipInfo {
            chip_type: c_array(&info.chip_type),
            chip_name: c_array(&info.chip_name),
            chip_ver: c_array(&info.chip_ver),
            aicore_cnt: info.aicore_cnt,
        }
    )
}

/// The chip's figure `pick`, or the code to answer: no such chip, or not supported.
fn figure<T>(card: c_int, device: c_int, pick: impl Fn(&Metrics) -> Option<T>) -> Result<T, c_int> {
    let c = chip(card, device).ok_or(INVALID_DEVICE_ID)?;
    pick(&c.metrics).ok_or(NOT_SUPPORT)
}

/// `dcmi_get_device_utilization_rate` (the AI cores only).
///
/// # Safety
/// `rate` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_device_utilization_rate(
    card_id: c_int,
    device_id: c_int,
    input_type: c_int,
    rate: *mut c_uint,
) -> c_int {
    check!("dcmi_get_device_utilization_rate");
    if input_type != AI_CORE {
        return NOT_SUPPORT;
    }
    match figure(card_id, device_id, |m| m.aicore) {
        Ok(v) => out!(rate, v),
        Err(code) => code,
    }
}

/// `dcmi_get_device_temperature`.
///
/// # Safety
/// `temperature` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_device_temperature(
    card_id: c_int,
    device_id: c_int,
    temperature: *mut c_int,
) -> c_int {
    check!("dcmi_get_device_temperature");
    match figure(card_id, device_id, |m| m.temperature) {
        Ok(v) => out!(temperature, v),
        Err(code) => code,
    }
}

/// `dcmi_get_device_power_info` (tenths of a watt).
///
/// # Safety
/// `power` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_device_power_info(
    card_id: c_int,
    device_id: c_int,
    power: *mut c_int,
) -> c_int {
    check!("dcmi_get_device_power_info");
    match figure(card_id, device_id, |m| m.power) {
        Ok(v) => out!(power, v),
        Err(code) => code,
    }
}

/// `dcmi_get_device_frequency` (the AI cores' clock now only).
///
/// # Safety
/// `frequency` is a writable out-parameter.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_device_frequency(
    card_id: c_int,
    device_id: c_int,
    input_type: c_int,
    frequency: *mut c_uint,
) -> c_int {
    check!("dcmi_get_device_frequency");
    if input_type != AI_CORE_CURRENT_FREQ {
        return NOT_SUPPORT;
    }
    match figure(card_id, device_id, |m| m.aicore_freq) {
        Ok(v) => out!(frequency, v),
        Err(code) => code,
    }
}

/// `dcmi_get_device_hbm_info`.
///
/// # Safety
/// `hbm_info` is a writable `struct dcmi_hbm_info`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_device_hbm_info(
    card_id: c_int,
    device_id: c_int,
    hbm_info: *mut DcmiHbmInfo,
) -> c_int {
    check!("dcmi_get_device_hbm_info");
    match figure(card_id, device_id, |m| Some((m.hbm_total?, m.hbm_used?))) {
        Ok((total, used)) => out!(
            hbm_info,
            DcmiHbmInfo {
                memory_size: total,
                freq: 0,
                memory_usage: used,
                temp: 0,
                bandwith_util_rate: 0,
            }
        ),
        Err(code) => code,
    }
}

/// `dcmi_get_hccs_link_bandwidth_info`: waits the `profiling_time` the caller set (1-1000 ms,
/// else invalid), then answers the chip's rates.
///
/// # Safety
/// `info` is a writable `struct dcmi_hccs_bandwidth_info` with `profiling_time` set.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_get_hccs_link_bandwidth_info(
    card_id: c_int,
    device_id: c_int,
    info: *mut DcmiHccsBandwidthInfo,
) -> c_int {
    check!("dcmi_get_hccs_link_bandwidth_info");
    if info.is_null() {
        return INVALID_PARAMETER;
    }
    // SAFETY: the caller passes a writable struct (checked non-null) with the window set.
    let window = unsafe { (*info).profiling_time };
    let Ok(ms) = u64::try_from(window) else {
        return INVALID_PARAMETER;
    };
    if !(1..=1000).contains(&ms) {
        return INVALID_PARAMETER;
    }
    let (tx, rx) = match figure(card_id, device_id, |m| {
        Some((m.hccs_tx.clone()?, m.hccs_rx.clone()?))
    }) {
        Ok(rates) => rates,
        Err(code) => return code,
    };
    std::thread::sleep(Duration::from_millis(ms));
    let per_link = |rates: &[f64]| {
        let mut a = [0.0; HCCS_LINKS];
        for (slot, r) in a.iter_mut().zip(rates) {
            *slot = *r;
        }
        a
    };
    let (tx, rx) = (per_link(&tx), per_link(&rx));
    out!(
        info,
        DcmiHccsBandwidthInfo {
            profiling_time: window,
            total_txbw: tx.iter().sum(),
            total_rxbw: rx.iter().sum(),
            tx_bandwidth: tx,
            rx_bandwidth: rx,
        }
    )
}

/// `struct dcmi_create_vdev_res_stru`.
#[repr(C)]
pub struct DcmiCreateVdevIn {
    vdev_id: c_uint,
    vfg_id: c_uint,
    template_name: [u8; CHIP_NAME_LEN],
    reserved: [u8; 64],
}

/// `struct dcmi_create_vdev_out`.
#[repr(C)]
pub struct DcmiCreateVdevOut {
    vdev_id: c_uint,
    pcie_bus: c_uint,
    pcie_device: c_uint,
    pcie_func: c_uint,
    vfg_id: c_uint,
    reserved: [u8; 32],
}

/// "The library picks".
const ANY_ID: c_uint = 0xFFFF_FFFF;
/// Huawei's first vNPU id.
const FIRST_VDEV_ID: c_uint = 100;

/// Rewrites the state file's `vdevices` with `edit` applied (whole file, renamed into place).
fn edit_vdevices(edit: impl FnOnce(&mut Vec<serde_json::Value>)) -> Result<(), c_int> {
    let path = std::env::var_os(STATE_ENV).ok_or(INVALID_PARAMETER)?;
    let text = std::fs::read_to_string(&path).map_err(|_| INVALID_PARAMETER)?;
    let mut state: serde_json::Value =
        serde_json::from_str(&text).map_err(|_| INVALID_PARAMETER)?;
    let mut list: Vec<serde_json::Value> =
        state["vdevices"].as_array().cloned().unwrap_or_default();
    edit(&mut list);
    state["vdevices"] = serde_json::Value::Array(list);
    let tmp = std::path::PathBuf::from(&path).with_extension("vdev.tmp");
    std::fs::write(&tmp, state.to_string()).map_err(|_| INVALID_PARAMETER)?;
    std::fs::rename(&tmp, &path).map_err(|_| INVALID_PARAMETER)
}

/// `dcmi_create_vdevice`.
///
/// # Safety
/// `vdev` is a readable `struct dcmi_create_vdev_res_stru`, `out` a writable
/// `struct dcmi_create_vdev_out`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dcmi_create_vdevice(
    card_id: c_int,
    device_id: c_int,
    vdev: *const DcmiCreateVdevIn,
    out: *mut DcmiCreateVdevOut,
) -> c_int {
    check!("dcmi_create_vdevice");
    if vdev.is_null() {
        return INVALID_PARAMETER;
    }
    // SAFETY: the caller passes a readable struct (checked non-null).
    let input = unsafe { &*vdev };
    let Some(nul) = input.template_name.iter().position(|b| *b == 0) else {
        return INVALID_PARAMETER;
    };
    let Ok(template) = std::str::from_utf8(&input.template_name[..nul]) else {
        return INVALID_PARAMETER;
    };
    let Some(c) = chip(card_id, device_id) else {
        return INVALID_DEVICE_ID;
    };
    if template.is_empty()
        || c.vnpu_templates
            .as_ref()
            .is_some_and(|t| !t.iter().any(|t| t == template))
    {
        return INVALID_PARAMETER;
    }
    let taken: Vec<c_uint> = state().vdevices.iter().map(|v| v.vdev_id).collect();
    let vdev_id = if input.vdev_id == ANY_ID {
        (FIRST_VDEV_ID..)
            .find(|id| !taken.contains(id))
            .unwrap_or(ANY_ID)
    } else if taken.contains(&input.vdev_id) {
        return INVALID_PARAMETER;
    } else {
        input.vdev_id
    };
    let entry = serde_json::json!(
        {"card": card_id, "device": device_id, "vdevId": vdev_id, "template": template}
    );
    if let Err(code) = edit_vdevices(|list| list.push(entry)) {
        return code;
    }
    out!(
        out,
        DcmiCreateVdevOut {
            vdev_id,
            pcie_bus: 0,
            pcie_device: 0,
            pcie_func: 0,
            vfg_id: 0,
            reserved: [0; 32],
        }
    )
}

/// `dcmi_set_destroy_vdevice`.
#[unsafe(no_mangle)]
pub extern "C" fn dcmi_set_destroy_vdevice(
    card_id: c_int,
    device_id: c_int,
    vdev_id: c_uint,
) -> c_int {
    check!("dcmi_set_destroy_vdevice");
    let held = state()
        .vdevices
        .iter()
        .any(|v| v.card == card_id && v.device == device_id && v.vdev_id == vdev_id);
    if !held {
        return INVALID_DEVICE_ID;
    }
    let gone = |v: &serde_json::Value| {
        v["card"] == card_id && v["device"] == device_id && v["vdevId"] == vdev_id
    };
    match edit_vdevices(|list| list.retain(|v| !gone(v))) {
        Ok(()) => OK,
        Err(code) => code,
    }
}
