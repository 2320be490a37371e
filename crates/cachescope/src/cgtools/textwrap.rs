//! Python's `textwrap.wrap` as argparse uses it for help texts: whitespace
//! collapsed, words broken after hyphens inside words, greedy filling.

/// Characters of `\w` (letters, digits, underscore).
fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// textwrap's `letter`: `[^\d\W]`.
fn is_letter(c: char) -> bool {
    is_word(c) && !c.is_numeric()
}

/// textwrap's `word_punct`: `[\w!"'&.,?]`.
fn is_word_punct(c: char) -> bool {
    is_word(c) || "!\"'&.,?".contains(c)
}

/// Splits text into textwrap's chunks: runs of spaces, and words split
/// after hyphens that join two letters-words (`wordsep_re`).
fn chunks(text: &str) -> Vec<String> {
    let c: Vec<char> = text.chars().collect();
    let at = |i: isize| -> Option<char> {
        if i < 0 {
            None
        } else {
            c.get(i as usize).copied()
        }
    };
    let letter = |i: isize| at(i).is_some_and(is_letter);
    let mut out = Vec::new();
    let mut i = 0usize;
    while i < c.len() {
        let start = i;
        if c[i] == ' ' {
            while i < c.len() && c[i] == ' ' {
                i += 1;
            }
        } else if i > 0
            && is_word_punct(c[i - 1])
            && c[i] == '-'
            && at(i as isize + 1) == Some('-')
            && {
                let mut j = i;
                while j < c.len() && c[j] == '-' {
                    j += 1;
                }
                at(j as isize).is_some_and(is_word)
            }
        {
            // An em-dash between words.
            while i < c.len() && c[i] == '-' {
                i += 1;
            }
        } else {
            // A word: the shortest run of non-spaces that ends at a
            // hyphenation point, before a space, or before an em-dash.
            let mut j = i + 1;
            loop {
                let ji = j as isize;
                if at(ji) == Some('-')
                    && ((letter(ji - 2) && letter(ji - 1))
                        || (letter(ji - 3) && at(ji - 2) == Some('-') && letter(ji - 1)))
                    && letter(ji + 1)
                    && (letter(ji + 2) || (at(ji + 2) == Some('-') && letter(ji + 3)))
                {
                    j += 1;
                    break;
                }
                if j >= c.len() || c[j] == ' ' {
                    break;
                }
                if is_word_punct(c[j - 1]) && c[j] == '-' && at(ji + 1) == Some('-') && {
                    let mut k = j;
                    while k < c.len() && c[k] == '-' {
                        k += 1;
                    }
                    at(k as isize).is_some_and(is_word)
                } {
                    break;
                }
                j += 1;
            }
            i = j;
        }
        out.push(c[start..i].iter().collect());
    }
    out
}

/// `textwrap.wrap(text, width)` after argparse's whitespace collapsing.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let collapsed = text.split_ascii_whitespace().collect::<Vec<_>>().join(" ");
    let mut rev: Vec<String> = chunks(&collapsed);
    rev.reverse();
    let mut lines = Vec::new();
    while !rev.is_empty() {
        let mut line: Vec<String> = Vec::new();
        let mut len = 0;
        if !lines.is_empty() && rev.last().is_some_and(|c| c.trim().is_empty()) {
            rev.pop();
        }
        while let Some(chunk) = rev.last() {
            let l = chunk.chars().count();
            if len + l <= width {
                len += l;
                line.push(rev.pop().unwrap_or_default());
            } else {
                break;
            }
        }
        if let Some(chunk) = rev.last() {
            if chunk.chars().count() > width {
                // A word longer than a line: break it, after a hyphen if
                // there is one early enough.
                let space_left = if width < 1 { 1 } else { width - len };
                let chars: Vec<char> = chunk.chars().collect();
                let mut end = space_left;
                if chars.len() > space_left {
                    if let Some(h) = chars[..space_left].iter().rposition(|&c| c == '-') {
                        if h > 0 && chars[..h].iter().any(|&c| c != '-') {
                            end = h + 1;
                        }
                    }
                }
                line.push(chars[..end].iter().collect());
                let rest: String = chars[end..].iter().collect();
                if let Some(last) = rev.last_mut() {
                    *last = rest;
                }
            }
        }
        if line.last().is_some_and(|c| c.trim().is_empty()) {
            line.pop();
        }
        if !line.is_empty() {
            lines.push(line.concat());
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hyphenated_words_split_after_the_hyphen() {
        assert_eq!(
            chunks("like --mod-filename, x"),
            vec!["like", " ", "--mod-", "filename,", " ", "x"]
        );
        assert_eq!(chunks("non-zero count"), vec!["non-", "zero", " ", "count"]);
        assert_eq!(chunks("a-b"), vec!["a-b"]);
    }

    #[test]
    fn wraps_greedily() {
        assert_eq!(
            wrap(
                "only show figures for events A,B,C (default: all events)",
                54
            ),
            vec![
                "only show figures for events A,B,C (default: all",
                "events)"
            ]
        );
        assert_eq!(
            wrap("show a percentage for each non-zero count", 30),
            vec!["show a percentage for each", "non-zero count"]
        );
        assert_eq!(
            wrap("show a percentage for each non-zero count", 31),
            vec!["show a percentage for each non-", "zero count"]
        );
    }
}
