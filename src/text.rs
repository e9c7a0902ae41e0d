//! Text from rows shown to people (the console's pages, the binary's text log): rows are written
//! by raw SQL too, so a value may hold control characters (a newline that forges a log line, an
//! escape sequence for a terminal) or invisible format characters (a right-to-left override that
//! makes `order-\u{202e}gnp.exe` read as `order-exe.png`, a zero-width space that makes two ids
//! look the same). Shown, they are written as escapes instead of obeyed.

use std::fmt;

/// Format characters that change how the text around them reads without showing themselves:
/// the Arabic letter mark, zero-width spaces and joiners, the left-to-right and right-to-left
/// marks, line and paragraph separators, bidirectional embeddings, overrides and isolates, word
/// joiners and invisible operators, and the byte order mark.
pub fn is_hidden_format(c: char) -> bool {
    matches!(
        c,
        '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}'
    )
}

/// Whether `c` is written as an escape when shown: a control character (C0, DEL, C1) or a hidden
/// format character.
pub fn is_escaped(c: char) -> bool {
    c.is_control() || is_hidden_format(c)
}

/// Writes `c` (one that [`is_escaped`]) as `\u{..}`.
pub fn write_escape(out: &mut impl fmt::Write, c: char) -> fmt::Result {
    write!(out, "\\u{{{:x}}}", u32::from(c))
}

/// A value for one line of text: `\n`, `\r` and `\t` as those escapes, every other escaped
/// character as `\u{..}`.
pub struct OneLine<'a>(pub &'a str);

impl fmt::Display for OneLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        for c in self.0.chars() {
            match c {
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                c if is_escaped(c) => write_escape(f, c)?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_hidden_format_characters_are_escaped_on_one_line() {
        let row = "evil\n2026 INFO forged\r\t\u{1b}[2J\u{7}\u{85}\u{202e}\u{2066}\u{200b}\u{feff}\u{61c}é中😀";
        assert_eq!(
            OneLine(row).to_string(),
            "evil\\n2026 INFO forged\\r\\t\\u{1b}[2J\\u{7}\\u{85}\\u{202e}\\u{2066}\\u{200b}\\u{feff}\\u{61c}é中😀"
        );
    }

    #[test]
    fn visible_text_is_left_alone() {
        for c in ['a', ' ', 'é', '中', '😀', '\u{a0}', '\u{2030}', '\u{206a}'] {
            assert!(!is_escaped(c), "{c:?}");
        }
    }
}
