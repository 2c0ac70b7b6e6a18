//! The node bootstrap document (`NodeConfig`, a node's user data, YAML or JSON) a booting
//! node parses: no panic.
#![no_main]

use flotilla_api_machinery::nodeconfig::NodeConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let _ = NodeConfig::parse(text);
});
