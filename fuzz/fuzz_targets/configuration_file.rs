#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fumarole_fuzz::configuration_file(data));
