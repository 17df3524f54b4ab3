//! Any text as a chat template: it compiles or not, renders or not, within its fuel and size.
#![no_main]
use engine::tokenizer::{ChatMessage, ChatTemplate};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(src) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(t) = ChatTemplate::new(src.to_string(), "fuzz".into()) {
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hello"),
        ];
        if let Ok(out) = t.render(&msgs, true, (Some("<s>"), Some("</s>")), None) {
            assert!(out.len() <= (1 << 20) + 64);
        }
    }
});
