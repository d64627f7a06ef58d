#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fumarole_fuzz::ascend_device_info(data));
