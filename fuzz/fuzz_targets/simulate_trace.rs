#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fumarole_fuzz::simulate_trace(data));
