//! Bindings to the part of Huawei's `libdcmi.so` the DCMI source calls, loaded at run time
//! with `libloading` and written from the library's documented C signatures. Every call
//! returns an `int`: 0 (`DCMI_OK`) or a negative error code (`DCMI_ERR_CODE_NOT_SUPPORT` is
//! -8255). Cards come from `dcmi_get_card_num_list` (older drivers) or `dcmi_get_card_list`
//! (newer ones, same signature); a chip is `(card id, device id in card)`.
//!
//! ```c
//! int dcmi_init(void);
//! int dcmi_get_card_num_list(int *card_num, int *card_list, int list_len);
//! int dcmi_get_device_num_in_card(int card_id, int *device_num);
//! int dcmi_get_device_logic_id(int *device_logic_id, int card_id, int device_id);
//! int dcmi_get_device_phyid_from_logicid(unsigned int logicid, unsigned int *phyid);
//! int dcmi_get_device_health(int card_id, int device_id, unsigned int *health);
//! int dcmi_get_device_errorcode_v2(int card_id, int device_id, int *error_count,
//!                                  unsigned int *error_code_list, unsigned int list_len);
//! int dcmi_get_device_network_health(int card_id, int device_id,
//!                                    enum dcmi_rdfx_detect_result *result);
//! int dcmi_get_device_info(int card_id, int device_id, enum dcmi_main_cmd main_cmd,
//!                          unsigned int sub_cmd, void *buf, unsigned int *size);
//! int dcmi_get_device_chip_info(int card_id, int device_id, struct dcmi_chip_info *chip_info);
//! ```
//!
//! Per-chip figures (the agent's `/metrics`, `crate::device_metrics::dcmi`), all optional:
//!
//! ```c
//! int dcmi_get_device_utilization_rate(int card_id, int device_id, int input_type,
//!                                      unsigned int *utilization_rate);   // %, AI core: 2
//! int dcmi_get_device_temperature(int card_id, int device_id, int *temperature);  // C
//! int dcmi_get_device_power_info(int card_id, int device_id, int *power);         // 0.1 W
//! int dcmi_get_device_frequency(int card_id, int device_id, enum dcmi_freq_type input_type,
//!                               unsigned int *frequency);   // MHz, AI core current: 7
//! int dcmi_get_device_hbm_info(int card_id, int device_id, struct dcmi_hbm_info *hbm_info);
//! int dcmi_get_hccs_link_bandwidth_info(int card_id, int device_id,
//!                                       struct dcmi_hccs_bandwidth_info *hccs_bandwidth_info);
//! ```
//!
//! `struct dcmi_hccs_bandwidth_info { int profiling_time; double total_txbw; double
//! total_rxbw; double tx_bandwidth[16]; double rx_bandwidth[16]; }` (`DCMI_HCCS_MAX_PCS_NUM`
//! 16; the caller sets `profiling_time`, the window in ms (1-1000) the library measures over
//! before it answers; rates in GB/s, per link and in all), from Huawei's DCMI API reference
//! page for the call (Atlas A2 and A3 training and inference servers).
//!
//! vNPUs (`crate::vnpu`, for DRA claims on vNPU partitions), from Huawei's DCMI API reference
//! pages for the calls:
//!
//! ```c
//! int dcmi_create_vdevice(int card_id, int device_id, struct dcmi_create_vdev_res_stru *vdev,
//!                         struct dcmi_create_vdev_out *out);
//! int dcmi_set_destroy_vdevice(int card_id, int device_id, unsigned int vdev_id);
//! ```
//!
//! `struct dcmi_create_vdev_res_stru { unsigned int vdev_id; unsigned int vfg_id; char
//! template_name[32]; unsigned char reserved[64]; }` (`vdev_id` and `vfg_id` 0xFFFFFFFF: the
//! library picks; the template as `npu-smi info -t template-info` names it, `vir02`) and
//! `struct dcmi_create_vdev_out { unsigned int vdev_id, pcie_bus, pcie_device, pcie_func,
//! vfg_id; unsigned char reserved[32]; }` (only `vdev_id` is filled).
//!
//! `struct dcmi_hbm_info { unsigned long long memory_size; unsigned int freq; unsigned long
//! long memory_usage; int temp; unsigned int bandwith_util_rate; }` (sizes in MB; 32 bytes with
//! its padding). The input types are those of Huawei's npu-exporter (`DeviceType` `AICore` 2,
//! `AICoreCurrentFreq` 7), which reads the same calls.
//!
//! `struct dcmi_chip_info { unsigned char chip_type[32], chip_name[32], chip_ver[32];
//! unsigned int aicore_cnt; }` (`MAX_CHIP_NAME_LEN` 32; 100 bytes). Sources: the DCMI header
//! `dcmi_interface_api.h` as shipped in Huawei's `ascend-docker-runtime` and in MindCluster's
//! `ascend-common/devmanager/dcmi`, whose `DcGetChipInfo` reads the same struct (after trying
//! `dcmi_get_device_chip_info_v2`, the same fields plus `npu_name`). The strings are C strings in
//! fixed arrays; [`super::answers::chip_info`] decides what a usable answer is.
//!
//! Super-pod membership (Atlas A3) is `dcmi_get_device_info` with main command
//! `DCMI_MAIN_CMD_CHIP_INF` (12) and sub command `DCMI_CHIP_INF_SUB_CMD_SPOD_INFO` (1) into a
//! 48-byte `struct dcmi_spod_info { unsigned int sdid, super_pod_size, super_pod_id,
//! server_index, chassis_id, super_pod_type, reserve[6]; }`. Sources: the DCMI header
//! `dcmi_interface_api.h` and how Huawei's own tools call it (`npu-smi`'s spod-info query,
//! which refuses chips other than 910_93 (A3) and 950; MindCluster's
//! `ascend-common/devmanager/dcmi` `DcGetSuperPodInfo`, which reads the same struct;
//! CANN components treat a super-pod id of `0xFFFFFFFF` as "none"). See
//! [`super::answers::super_pod`] for what the numbers mean.

use std::ffi::{c_int, c_uint};
use std::path::Path;

use libloading::Library;

/// `DCMI_ERR_CODE_NOT_SUPPORT`.
pub const NOT_SUPPORTED: i32 = -8255;
/// `MAX_CARD_NUM`: the most cards a node has.
pub const MAX_CARDS: usize = 64;
/// The most chips one card holds that we accept (A3 cards hold 2).
pub const MAX_CHIPS_PER_CARD: i32 = 16;
/// The most error codes read per chip.
pub const MAX_ERROR_CODES: usize = 128;
/// `DCMI_MAIN_CMD_CHIP_INF`.
pub const MAIN_CMD_CHIP_INF: c_int = 12;
/// `DCMI_CHIP_INF_SUB_CMD_SPOD_INFO`.
pub const SUB_CMD_SPOD_INFO: c_uint = 1;
/// `sizeof(struct dcmi_spod_info)`: twelve unsigned ints.
pub const SPOD_INFO_WORDS: usize = 12;

type InitFn = unsafe extern "C" fn() -> c_int;
type CardListFn = unsafe extern "C" fn(*mut c_int, *mut c_int, c_int) -> c_int;
type DeviceNumFn = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;
type LogicIdFn = unsafe extern "C" fn(*mut c_int, c_int, c_int) -> c_int;
type PhyIdFn = unsafe extern "C" fn(c_uint, *mut c_uint) -> c_int;
type HealthFn = unsafe extern "C" fn(c_int, c_int, *mut c_uint) -> c_int;
type ErrorCodesFn = unsafe extern "C" fn(c_int, c_int, *mut c_int, *mut c_uint, c_uint) -> c_int;
type NetworkHealthFn = unsafe extern "C" fn(c_int, c_int, *mut c_int) -> c_int;
type ChipInfoFn = unsafe extern "C" fn(c_int, c_int, *mut RawChipInfo) -> c_int;
type RateFn = unsafe extern "C" fn(c_int, c_int, c_int, *mut c_uint) -> c_int;
type IntFn = unsafe extern "C" fn(c_int, c_int, *mut c_int) -> c_int;
type HbmFn = unsafe extern "C" fn(c_int, c_int, *mut RawHbmInfo) -> c_int;
type HccsFn = unsafe extern "C" fn(c_int, c_int, *mut RawHccsBandwidth) -> c_int;
type CreateVdevFn =
    unsafe extern "C" fn(c_int, c_int, *mut RawCreateVdevIn, *mut RawCreateVdevOut) -> c_int;
type DestroyVdevFn = unsafe extern "C" fn(c_int, c_int, c_uint) -> c_int;

/// `TEMPLATE_NAME_LEN`.
pub const TEMPLATE_NAME_LEN: usize = 32;
/// "The library picks" for a vdev or group id.
pub const ANY_ID: c_uint = 0xFFFF_FFFF;

/// `struct dcmi_create_vdev_res_stru`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawCreateVdevIn {
    pub vdev_id: c_uint,
    pub vfg_id: c_uint,
    pub template_name: [u8; TEMPLATE_NAME_LEN],
    pub reserved: [u8; 64],
}

/// `struct dcmi_create_vdev_out`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCreateVdevOut {
    pub vdev_id: c_uint,
    pub pcie_bus: c_uint,
    pub pcie_device: c_uint,
    pub pcie_func: c_uint,
    pub vfg_id: c_uint,
    pub reserved: [u8; 32],
}
/// `main_cmd` is a C enum: an int.
type DeviceInfoFn =
    unsafe extern "C" fn(c_int, c_int, c_int, c_uint, *mut std::ffi::c_void, *mut c_uint) -> c_int;

/// `struct dcmi_spod_info` as the library fills it (the fields we read; the rest is reserved).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpodInfo {
    pub sdid: u32,
    pub super_pod_size: u32,
    pub super_pod_id: u32,
    pub server_index: u32,
    pub chassis_id: u32,
    pub super_pod_type: u32,
}

/// `dcmi_get_device_utilization_rate`'s input type for the AI cores.
pub const UTILIZATION_AI_CORE: c_int = 2;
/// `DCMI_FREQ_AICORE_CURRENT_`: the AI cores' clock now.
pub const FREQUENCY_AI_CORE_CURRENT: c_int = 7;

/// `struct dcmi_hbm_info`, exactly as the library fills it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawHbmInfo {
    /// MB.
    pub memory_size: u64,
    /// MHz.
    pub freq: c_uint,
    /// MB.
    pub memory_usage: u64,
    /// C.
    pub temp: c_int,
    /// %.
    pub bandwidth_util_rate: c_uint,
}

/// `DCMI_HCCS_MAX_PCS_NUM`: the HCCS links a chip reports.
pub const HCCS_LINKS: usize = 16;

/// `struct dcmi_hccs_bandwidth_info`, exactly as the library fills it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RawHccsBandwidth {
    /// In: the window measured over, ms (1-1000).
    pub profiling_time: c_int,
    /// GB/s.
    pub total_tx: f64,
    pub total_rx: f64,
    pub tx: [f64; HCCS_LINKS],
    pub rx: [f64; HCCS_LINKS],
}

/// The optional per-chip calls: figures and vNPUs (`None`: the library lacks the call).
#[derive(Clone, Copy, Default)]
struct ChipCalls {
    utilization: Option<RateFn>,
    temperature: Option<IntFn>,
    power: Option<IntFn>,
    frequency: Option<RateFn>,
    hbm: Option<HbmFn>,
    hccs: Option<HccsFn>,
    create_vdev: Option<CreateVdevFn>,
    destroy_vdev: Option<DestroyVdevFn>,
}

/// `MAX_CHIP_NAME_LEN`: the size of each string array of `struct dcmi_chip_info`.
pub const CHIP_NAME_LEN: usize = 32;

/// `struct dcmi_chip_info`, exactly as the library fills it (bytes as given, not decoded).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawChipInfo {
    pub chip_type: [u8; CHIP_NAME_LEN],
    pub chip_name: [u8; CHIP_NAME_LEN],
    pub chip_ver: [u8; CHIP_NAME_LEN],
    pub aicore_cnt: c_uint,
}

/// Why the library cannot be used at all.
#[derive(Debug, thiserror::Error)]
pub enum DcmiError {
    /// The file is not there or not a loadable library.
    #[error("loading {path}: {reason}")]
    Load { path: String, reason: String },
    /// A call the source cannot do without is missing (a library too old).
    #[error("{path} has no {symbol}: a DCMI library too old for health checks")]
    Missing { path: String, symbol: &'static str },
    /// `dcmi_init` failed.
    #[error("dcmi_init returned {0}")]
    Init(i32),
}

/// A failed call: its name and return code, or an answer out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} returned {code}")]
pub struct CallError {
    pub call: &'static str,
    pub code: i64,
}

/// The loaded library and the calls resolved from it. The function pointers are valid while
/// `_lib` is alive, that is as long as this value.
pub struct Dcmi {
    init: InitFn,
    card_list: (CardListFn, &'static str),
    device_num: DeviceNumFn,
    logic_id: LogicIdFn,
    health: HealthFn,
    phy_id: Option<PhyIdFn>,
    error_codes: Option<ErrorCodesFn>,
    network_health: Option<NetworkHealthFn>,
    device_info: Option<DeviceInfoFn>,
    chip_info: Option<ChipInfoFn>,
    chip_calls: ChipCalls,
    _lib: Library,
}

fn check(call: &'static str, ret: c_int) -> Result<(), CallError> {
    if ret == 0 {
        Ok(())
    } else {
        Err(CallError {
            call,
            code: i64::from(ret),
        })
    }
}

impl Dcmi {
    /// Loads the library at `path` (a file, or a name the loader searches for) and resolves
    /// its calls. Optional ones (phy ids, error codes, network health) may be missing.
    pub fn open(path: &Path) -> Result<Dcmi, DcmiError> {
        let shown = path.display().to_string();
        // SAFETY: loading a library runs its initialisers; libdcmi.so (or a stand-in for it)
        // is a plain C library the operator pointed us at.
        let lib = unsafe { Library::new(path.as_os_str()) }.map_err(|e| DcmiError::Load {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        /// Resolves `name` as a function of type `T`.
        fn sym<T: Copy>(lib: &Library, name: &'static str) -> Option<T> {
            let with_nul = format!("{name}\0");
            // SAFETY: `T` is the documented C signature of `name`; the copied pointer is used
            // only while `lib` is alive (it is stored beside it in `Dcmi`).
            unsafe { lib.get::<T>(with_nul.as_bytes()).ok().map(|s| *s) }
        }
        let required = |name: &'static str| DcmiError::Missing {
            path: shown.clone(),
            symbol: name,
        };
        let card_list = sym::<CardListFn>(&lib, "dcmi_get_card_num_list")
            .map(|f| (f, "dcmi_get_card_num_list"))
            .or_else(|| {
                sym::<CardListFn>(&lib, "dcmi_get_card_list").map(|f| (f, "dcmi_get_card_list"))
            })
            .ok_or_else(|| required("dcmi_get_card_num_list"))?;
        Ok(Dcmi {
            init: sym(&lib, "dcmi_init").ok_or_else(|| required("dcmi_init"))?,
            card_list,
            device_num: sym(&lib, "dcmi_get_device_num_in_card")
                .ok_or_else(|| required("dcmi_get_device_num_in_card"))?,
            logic_id: sym(&lib, "dcmi_get_device_logic_id")
                .ok_or_else(|| required("dcmi_get_device_logic_id"))?,
            health: sym(&lib, "dcmi_get_device_health")
                .ok_or_else(|| required("dcmi_get_device_health"))?,
            phy_id: sym(&lib, "dcmi_get_device_phyid_from_logicid"),
            error_codes: sym(&lib, "dcmi_get_device_errorcode_v2"),
            network_health: sym(&lib, "dcmi_get_device_network_health"),
            device_info: sym(&lib, "dcmi_get_device_info"),
            chip_info: sym(&lib, "dcmi_get_device_chip_info"),
            chip_calls: ChipCalls {
                utilization: sym(&lib, "dcmi_get_device_utilization_rate"),
                temperature: sym(&lib, "dcmi_get_device_temperature"),
                power: sym(&lib, "dcmi_get_device_power_info"),
                frequency: sym(&lib, "dcmi_get_device_frequency"),
                hbm: sym(&lib, "dcmi_get_device_hbm_info"),
                hccs: sym(&lib, "dcmi_get_hccs_link_bandwidth_info"),
                create_vdev: sym(&lib, "dcmi_create_vdevice"),
                destroy_vdev: sym(&lib, "dcmi_set_destroy_vdevice"),
            },
            _lib: lib,
        })
    }

    /// The optional calls this library lacks.
    pub fn missing_optional(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.phy_id.is_none() {
            out.push("dcmi_get_device_phyid_from_logicid");
        }
        if self.error_codes.is_none() {
            out.push("dcmi_get_device_errorcode_v2");
        }
        if self.network_health.is_none() {
            out.push("dcmi_get_device_network_health");
        }
        if self.device_info.is_none() {
            out.push("dcmi_get_device_info");
        }
        if self.chip_info.is_none() {
            out.push("dcmi_get_device_chip_info");
        }
        out
    }

    /// `dcmi_init`.
    pub fn init(&self) -> Result<(), DcmiError> {
        // SAFETY: no arguments; the pointer comes from the live library.
        let ret = unsafe { (self.init)() };
        if ret == 0 {
            Ok(())
        } else {
            Err(DcmiError::Init(ret))
        }
    }

    /// The card ids.
    pub fn cards(&self) -> Result<Vec<i32>, CallError> {
        let (f, call) = self.card_list;
        let mut list = [0 as c_int; MAX_CARDS];
        let mut count: c_int = 0;
        let len = c_int::try_from(MAX_CARDS).unwrap_or(c_int::MAX);
        // SAFETY: `count` is writable and `list` holds `len` ints, as the call requires.
        check(call, unsafe { f(&mut count, list.as_mut_ptr(), len) })?;
        let n = usize::try_from(count)
            .ok()
            .filter(|n| *n <= MAX_CARDS)
            .ok_or(CallError {
                call,
                code: i64::from(count),
            })?;
        Ok(list[..n].to_vec())
    }

    /// How many chips card `card` holds.
    pub fn chips_in_card(&self, card: i32) -> Result<i32, CallError> {
        let call = "dcmi_get_device_num_in_card";
        let mut n: c_int = 0;
        // SAFETY: `n` is writable for the call.
        check(call, unsafe { (self.device_num)(card, &mut n) })?;
        if !(0..=MAX_CHIPS_PER_CARD).contains(&n) {
            return Err(CallError {
                call,
                code: i64::from(n),
            });
        }
        Ok(n)
    }

    /// The chip's logic id.
    pub fn logic_id(&self, card: i32, chip: i32) -> Result<i32, CallError> {
        let mut id: c_int = -1;
        // SAFETY: `id` is writable for the call.
        check("dcmi_get_device_logic_id", unsafe {
            (self.logic_id)(&mut id, card, chip)
        })?;
        Ok(id)
    }

    /// The chip's physical id (its `/dev/davinciN` number); the logic id when the library
    /// cannot say.
    pub fn phy_id(&self, logic: i32) -> Result<u32, CallError> {
        let logic_u = u32::try_from(logic).map_err(|_| CallError {
            call: "dcmi_get_device_logic_id",
            code: i64::from(logic),
        })?;
        let Some(f) = self.phy_id else {
            return Ok(logic_u);
        };
        let mut phy: c_uint = 0;
        // SAFETY: `phy` is writable for the call.
        check("dcmi_get_device_phyid_from_logicid", unsafe {
            f(logic_u, &mut phy)
        })?;
        Ok(phy)
    }

    /// `dcmi_get_device_health`.
    pub fn health(&self, card: i32, chip: i32) -> Result<u32, CallError> {
        let mut h: c_uint = 0;
        // SAFETY: `h` is writable for the call.
        check("dcmi_get_device_health", unsafe {
            (self.health)(card, chip, &mut h)
        })?;
        Ok(h)
    }

    /// `dcmi_get_device_errorcode_v2`; `None` when the library lacks it.
    pub fn error_codes(&self, card: i32, chip: i32) -> Option<Result<Vec<u32>, CallError>> {
        let f = self.error_codes?;
        let call = "dcmi_get_device_errorcode_v2";
        let mut count: c_int = 0;
        let mut list = [0 as c_uint; MAX_ERROR_CODES];
        let len = c_uint::try_from(MAX_ERROR_CODES).unwrap_or(c_uint::MAX);
        // SAFETY: `count` is writable and `list` holds `len` unsigned ints.
        let ret = unsafe { f(card, chip, &mut count, list.as_mut_ptr(), len) };
        Some(check(call, ret).and_then(|()| {
            let n = usize::try_from(count)
                .ok()
                .filter(|n| *n <= MAX_ERROR_CODES)
                .ok_or(CallError {
                    call,
                    code: i64::from(count),
                })?;
            Ok(list[..n].to_vec())
        }))
    }

    /// `dcmi_get_device_network_health`; `None` when the library lacks it.
    pub fn network_health(&self, card: i32, chip: i32) -> Option<Result<i32, CallError>> {
        let f = self.network_health?;
        let mut result: c_int = -1;
        // SAFETY: `result` is writable for the call (a C enum is an int).
        let ret = unsafe { f(card, chip, &mut result) };
        Some(check("dcmi_get_device_network_health", ret).map(|()| result))
    }
}

impl Dcmi {
    /// The chip's super-pod info (`dcmi_get_device_info`, chip-info main command, spod-info sub
    /// command); `None` when the library lacks the call. Chips without super-pod info are
    /// expected to answer `DCMI_ERR_CODE_NOT_SUPPORT`. An answer shorter than the struct's fields is an error.
    pub fn spod_info(&self, card: i32, chip: i32) -> Option<Result<SpodInfo, CallError>> {
        let f = self.device_info?;
        let call = "dcmi_get_device_info";
        let mut words = [0 as c_uint; SPOD_INFO_WORDS];
        let full = c_uint::try_from(std::mem::size_of_val(&words)).unwrap_or(c_uint::MAX);
        let mut size = full;
        // SAFETY: `words` is `size` writable bytes, as the call requires; `size` is writable.
        let ret = unsafe {
            f(
                card,
                chip,
                MAIN_CMD_CHIP_INF,
                SUB_CMD_SPOD_INFO,
                words.as_mut_ptr().cast(),
                &mut size,
            )
        };
        // The six fields we read are the first 24 bytes.
        let needed = c_uint::try_from(6 * std::mem::size_of::<c_uint>()).unwrap_or(c_uint::MAX);
        Some(check(call, ret).and_then(|()| {
            if size < needed || size > full {
                return Err(CallError {
                    call,
                    code: i64::from(size),
                });
            }
            Ok(SpodInfo {
                sdid: words[0],
                super_pod_size: words[1],
                super_pod_id: words[2],
                server_index: words[3],
                chassis_id: words[4],
                super_pod_type: words[5],
            })
        }))
    }
}

impl Dcmi {
    /// `dcmi_get_device_chip_info`; `None` when the library lacks it (an older DCMI).
    pub fn chip_info(&self, card: i32, chip: i32) -> Option<Result<RawChipInfo, CallError>> {
        let f = self.chip_info?;
        let mut info = RawChipInfo {
            chip_type: [0; CHIP_NAME_LEN],
            chip_name: [0; CHIP_NAME_LEN],
            chip_ver: [0; CHIP_NAME_LEN],
            aicore_cnt: 0,
        };
        // SAFETY: `info` is a writable `struct dcmi_chip_info` (same layout, `repr(C)`).
        let ret = unsafe { f(card, chip, &mut info) };
        Some(check("dcmi_get_device_chip_info", ret).map(|()| info))
    }
}

/// A figure call the library lacks: the same answer as a chip that does not support it.
fn lacking(call: &'static str) -> CallError {
    CallError {
        call,
        code: i64::from(NOT_SUPPORTED),
    }
}

impl Dcmi {
    /// `dcmi_get_device_utilization_rate` of `input_type`, in percent.
    pub fn utilization(&self, card: i32, chip: i32, input_type: c_int) -> Result<u32, CallError> {
        let call = "dcmi_get_device_utilization_rate";
        let f = self.chip_calls.utilization.ok_or(lacking(call))?;
        let mut rate: c_uint = 0;
        // SAFETY: `rate` is writable for the call.
        check(call, unsafe { f(card, chip, input_type, &mut rate) })?;
        Ok(rate)
    }

    /// `dcmi_get_device_temperature`, in degrees Celsius.
    pub fn temperature(&self, card: i32, chip: i32) -> Result<i32, CallError> {
        let call = "dcmi_get_device_temperature";
        let f = self.chip_calls.temperature.ok_or(lacking(call))?;
        let mut t: c_int = 0;
        // SAFETY: `t` is writable for the call.
        check(call, unsafe { f(card, chip, &mut t) })?;
        Ok(t)
    }

    /// `dcmi_get_device_power_info`, in tenths of a watt.
    pub fn power(&self, card: i32, chip: i32) -> Result<i32, CallError> {
        let call = "dcmi_get_device_power_info";
        let f = self.chip_calls.power.ok_or(lacking(call))?;
        let mut p: c_int = 0;
        // SAFETY: `p` is writable for the call.
        check(call, unsafe { f(card, chip, &mut p) })?;
        Ok(p)
    }

    /// `dcmi_get_device_frequency` of `input_type`, in MHz.
    pub fn frequency(&self, card: i32, chip: i32, input_type: c_int) -> Result<u32, CallError> {
        let call = "dcmi_get_device_frequency";
        let f = self.chip_calls.frequency.ok_or(lacking(call))?;
        let mut mhz: c_uint = 0;
        // SAFETY: `mhz` is writable for the call (a C enum is an int).
        check(call, unsafe { f(card, chip, input_type, &mut mhz) })?;
        Ok(mhz)
    }

    /// `dcmi_get_device_hbm_info`.
    pub fn hbm(&self, card: i32, chip: i32) -> Result<RawHbmInfo, CallError> {
        let call = "dcmi_get_device_hbm_info";
        let f = self.chip_calls.hbm.ok_or(lacking(call))?;
        let mut info = RawHbmInfo::default();
        // SAFETY: `info` is a writable `struct dcmi_hbm_info` (same layout, `repr(C)`).
        check(call, unsafe { f(card, chip, &mut info) })?;
        Ok(info)
    }

    /// `dcmi_get_hccs_link_bandwidth_info`, measured over `window_ms` (1-1000): the call
    /// takes that long.
    pub fn hccs_bandwidth(
        &self,
        card: i32,
        chip: i32,
        window_ms: i32,
    ) -> Result<RawHccsBandwidth, CallError> {
        let call = "dcmi_get_hccs_link_bandwidth_info";
        let f = self.chip_calls.hccs.ok_or(lacking(call))?;
        let mut info = RawHccsBandwidth {
            profiling_time: window_ms.clamp(1, 1000),
            ..Default::default()
        };
        // SAFETY: `info` is a writable `struct dcmi_hccs_bandwidth_info` (same layout, `repr(C)`).
        check(call, unsafe { f(card, chip, &mut info) })?;
        Ok(info)
    }
}

impl Dcmi {
    /// `dcmi_create_vdevice` of `template` (`vir02`) on the chip, the vdev id picked by the
    /// library: the new vNPU's vdev id.
    pub fn create_vdevice(&self, card: i32, chip: i32, template: &str) -> Result<u32, CallError> {
        let call = "dcmi_create_vdevice";
        let f = self.chip_calls.create_vdev.ok_or(lacking(call))?;
        // The name and its NUL must fit the array.
        if template.len() >= TEMPLATE_NAME_LEN || template.contains('\0') {
            return Err(CallError {
                call,
                code: i64::try_from(template.len()).unwrap_or(i64::MAX),
            });
        }
        let mut input = RawCreateVdevIn {
            vdev_id: ANY_ID,
            vfg_id: ANY_ID,
            template_name: [0; TEMPLATE_NAME_LEN],
            reserved: [0; 64],
        };
        input.template_name[..template.len()].copy_from_slice(template.as_bytes());
        let mut out = RawCreateVdevOut::default();
        // SAFETY: both structs are writable and laid out as the header's (`repr(C)`).
        check(call, unsafe { f(card, chip, &mut input, &mut out) })?;
        Ok(out.vdev_id)
    }

    /// `dcmi_set_destroy_vdevice`.
    pub fn destroy_vdevice(&self, card: i32, chip: i32, vdev_id: u32) -> Result<(), CallError> {
        let call = "dcmi_set_destroy_vdevice";
        let f = self.chip_calls.destroy_vdev.ok_or(lacking(call))?;
        // SAFETY: plain values.
        check(call, unsafe { f(card, chip, vdev_id) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vdevice_structs_have_the_c_layout() {
        assert_eq!(std::mem::size_of::<RawCreateVdevIn>(), 104);
        assert_eq!(std::mem::offset_of!(RawCreateVdevIn, template_name), 8);
        assert_eq!(std::mem::size_of::<RawCreateVdevOut>(), 52);
    }

    #[test]
    fn hccs_bandwidth_info_has_the_c_layout() {
        // int (+4 padding), two doubles, two arrays of 16 doubles: 280 bytes.
        assert_eq!(std::mem::size_of::<RawHccsBandwidth>(), 280);
        assert_eq!(std::mem::offset_of!(RawHccsBandwidth, total_tx), 8);
        assert_eq!(std::mem::offset_of!(RawHccsBandwidth, tx), 24);
        assert_eq!(std::mem::offset_of!(RawHccsBandwidth, rx), 152);
    }

    #[test]
    fn hbm_info_has_the_c_layout() {
        // u64, u32 (+4 padding), u64, i32, u32: 32 bytes, 8-aligned, usage at offset 16.
        assert_eq!(std::mem::size_of::<RawHbmInfo>(), 32);
        assert_eq!(std::mem::align_of::<RawHbmInfo>(), 8);
        assert_eq!(std::mem::offset_of!(RawHbmInfo, memory_usage), 16);
        assert_eq!(std::mem::offset_of!(RawHbmInfo, bandwidth_util_rate), 28);
    }

    #[test]
    fn chip_info_has_the_c_layout() {
        // Three 32-byte arrays and an unsigned int: 100 bytes, 4-aligned, as the header's.
        assert_eq!(std::mem::size_of::<RawChipInfo>(), 100);
        assert_eq!(std::mem::align_of::<RawChipInfo>(), 4);
    }

    #[test]
    fn a_missing_library_is_a_load_error() {
        let err = Dcmi::open(Path::new("/nonexistent/libdcmi.so"))
            .err()
            .unwrap();
        assert!(matches!(err, DcmiError::Load { .. }), "{err}");
    }

    #[test]
    fn a_library_without_the_calls_names_the_first_missing_one() {
        // Any loadable library that is not DCMI: the C library.
        let err = Dcmi::open(Path::new("libc.so.6")).err().unwrap();
        assert_eq!(
            err.to_string(),
            "libc.so.6 has no dcmi_get_card_num_list: a DCMI library too old for health checks"
        );
    }
}
