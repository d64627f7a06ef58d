#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fumarole_fuzz::dcmi_chip_info(data));
