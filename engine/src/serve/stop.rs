//! Stop strings (`stop` in a request) over streamed text: text that could still turn into a
//! stop string is held back until it cannot, so a stream never shows part of one, and the text
//! before the first stop string is all a response holds.

pub struct StopText {
    stops: Vec<String>,
    held: String,
    hit: bool,
}

impl StopText {
    pub fn new(stops: Vec<String>) -> StopText {
        StopText {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            hit: false,
        }
    }

    /// Whether a stop string has appeared (nothing more is shown after it).
    pub fn hit(&self) -> bool {
        self.hit
    }

    /// Adds `new` text; returns what can be shown now.
    pub fn feed(&mut self, new: &str) -> String {
        if self.hit {
            return String::new();
        }
        self.held.push_str(new);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s)).min() {
            self.hit = true;
            let shown = self.held[..at].to_string();
            self.held.clear();
            return shown;
        }
        // Keep the longest tail that is the start of some stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| {
                s.char_indices()
                    .map(|(i, _)| i)
                    .skip(1)
                    .filter(|&i| self.held.ends_with(&s[..i]))
            })
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let shown = self.held[..cut].to_string();
        self.held.drain(..cut);
        shown
    }

    /// The held text, at the end of generation (no stop string can complete any more).
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::StopText;

    /// Feeds `pieces` and returns (shown text, hit).
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut s = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut shown = String::new();
        for p in pieces {
            shown += &s.feed(p);
        }
        if !s.hit() {
            shown += &s.flush();
        }
        (shown, s.hit())
    }

    #[test]
    fn text_before_the_first_stop_string_is_shown_and_nothing_after() {
        assert_eq!(
            run(&["END"], &["ab", "cE", "N", "Dxy"]),
            ("abc".into(), true)
        );
        assert_eq!(
            run(&["\n\n", "##"], &["a#b\n", "\nc"]),
            ("a#b".into(), true)
        );
        // The earliest of several stop strings wins.
        assert_eq!(run(&["cd", "b"], &["abcd"]), ("a".into(), true));
        // A partial match that does not complete is shown once it cannot.
        assert_eq!(run(&["END"], &["EN", "d!"]), ("ENd!".into(), false));
        assert_eq!(run(&["END"], &["xEN"]), ("xEN".into(), false));
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        // Multi-byte characters.
        assert_eq!(run(&["é!"], &["caf", "é", "é!"]), ("café".into(), true));
    }

    #[test]
    fn a_possible_stop_string_is_held_back_while_streaming() {
        let mut s = StopText::new(vec!["STOP".into()]);
        assert_eq!(s.feed("go ST"), "go ");
        assert_eq!(s.feed("O"), "");
        assert_eq!(s.feed("RM"), "STORM");
    }
}
