//! Text made safe to echo. Names and paths come from presets, documents, command lines and the
//! host; printed raw, a control character in one (an escape sequence that clears the screen, a
//! carriage return that overwrites a line) or a bidirectional override (which makes a terminal or
//! a browser show characters in another order than they are) makes the output lie. Everything
//! peerlink prints passes through [`printable`] (whole outputs) or [`one_line`] (a field inside
//! a line, a message).
//!
//! What is taken out: the C0 controls (U+0000–U+001F) but newline and tab where a whole output is
//! echoed, DEL (U+007F), the C1 controls (U+0080–U+009F), and Unicode's bidirectional marks,
//! embeddings, overrides and isolates (U+200E, U+200F, U+202A–U+202E, U+2066–U+2069).

use std::borrow::Cow;

/// Whether `c` is never echoed: a control character (but newline and tab, which [`printable`]
/// keeps) or a bidirectional mark, embedding, override or isolate.
pub fn is_unsafe(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t') || is_bidi_control(c)
}

/// Unicode's bidirectional formatting characters: the marks LRM and RLM, the embeddings and
/// overrides LRE, RLE, PDF, LRO, RLO, and the isolates LRI, RLI, FSI, PDI.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// `text` without the characters [`is_unsafe`] names: newlines and tabs stay (an output's lines
/// and columns). Borrows where there is nothing to take out, as almost always.
pub fn printable(text: &str) -> Cow<'_, str> {
    match text.chars().any(is_unsafe) {
        false => Cow::Borrowed(text),
        true => Cow::Owned(text.chars().filter(|&c| !is_unsafe(c)).collect()),
    }
}

/// `text` as one line: what [`printable`] leaves, with each newline or tab made a space (a name
/// or a path inside a message or a table cell).
pub fn one_line(text: &str) -> Cow<'_, str> {
    match text.chars().any(|c| c.is_control() || is_bidi_control(c)) {
        false => Cow::Borrowed(text),
        true => Cow::Owned(
            printable(text)
                .chars()
                .map(|c| if c == '\n' || c == '\t' { ' ' } else { c })
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_overrides_are_taken_out() {
        assert_eq!(printable("\u{1b}[2J\u{1b}[Hpwned"), "[2J[Hpwned");
        assert_eq!(printable("a\u{7f}b\u{9b}c\u{85}d"), "abcd");
        assert_eq!(printable("abc\u{202E}fed\u{202C}"), "abcfed");
        for c in [
            '\u{200E}', '\u{200F}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
        ] {
            assert_eq!(printable(&format!("x{c}y")), "xy", "{c:?}");
        }
        assert_eq!(printable("over\rwritten\u{0}"), "overwritten");
    }

    #[test]
    fn lines_and_columns_stay_in_an_output_and_go_in_a_field() {
        assert_eq!(printable("a\tb\nc"), "a\tb\nc");
        assert_eq!(one_line("a\tb\nc\u{1b}"), "a b c");
        assert!(matches!(
            one_line("NVIDIA H100 80GB HBM3"),
            Cow::Borrowed(_)
        ));
        assert!(matches!(printable("Zürich ✓ 東京"), Cow::Borrowed(_)));
    }
}
