#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mcp_replay_guard_fuzz::canonicalise(data));
