//! Line numbers of CSV records, counted by afkit from the text.
//!
//! The csv crate's `Position::line` is not the line a person sees in an editor: a record's
//! position is taken before the line terminator of the previous record has been read whole (so a
//! CRLF file, as spreadsheets and Mechanical Turk write them, is one line behind) and before the
//! blank lines that precede the record. Its byte offset is exact, though, so afkit maps that
//! offset onto the text's lines itself: the line of a record is the line of its first byte after
//! any line terminators.

/// Maps csv byte offsets to 1-based line numbers. Lookups are expected in increasing order (the
/// order records are read in), which keeps the whole file's lookups linear in its length.
pub struct RecordLines<'a> {
    text: &'a [u8],
    /// The byte up to which lines have been counted, and the line it is on.
    pos: usize,
    line: u64,
}

impl<'a> RecordLines<'a> {
    pub fn new(text: &'a [u8]) -> RecordLines<'a> {
        RecordLines {
            text,
            pos: 0,
            line: 1,
        }
    }

    /// The line on which the record whose csv position is `byte` starts.
    pub(crate) fn line_of(&mut self, byte: u64) -> u64 {
        let mut start = usize::try_from(byte).map_or(self.text.len(), |b| b.min(self.text.len()));
        while start < self.text.len() && matches!(self.text[start], b'\r' | b'\n') {
            start += 1;
        }
        if start < self.pos {
            self.pos = 0;
            self.line = 1;
        }
        self.line += self.text[self.pos..start]
            .iter()
            .filter(|&&b| b == b'\n')
            .count() as u64;
        self.pos = start;
        self.line
    }

    /// The line of a csv record, or of the record a csv error is about (line 1 when the error
    /// carries no position: the header).
    pub fn line_of_position(&mut self, position: Option<&csv::Position>) -> u64 {
        position.map_or(1, |p| self.line_of(p.byte()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The line of every record of `text`, as afkit counts them.
    fn record_lines(text: &str) -> Vec<u64> {
        let mut lines = RecordLines::new(text.as_bytes());
        csv::ReaderBuilder::new()
            .has_headers(false)
            .from_reader(text.as_bytes())
            .records()
            .map(|r| lines.line_of_position(r.unwrap().position()))
            .collect()
    }

    #[test]
    fn crlf_and_blank_lines_count_as_an_editor_counts() {
        assert_eq!(record_lines("a,b\nc,d\ne,f\n"), [1, 2, 3]);
        assert_eq!(record_lines("a,b\r\nc,d\r\ne,f\r\n"), [1, 2, 3]);
        assert_eq!(record_lines("a,b\r\n\r\n\r\nc,d\r\n\ne,f"), [1, 4, 6]);
        assert_eq!(record_lines("a,\"two\r\nlines\"\r\nc,d\r\n"), [1, 3]);
    }

    proptest! {
        /// Rows of plain fields with any mix of terminators and blank lines: each record is
        /// found on the line where its text starts.
        #[test]
        fn every_record_is_on_the_line_where_it_starts(
            rows in proptest::collection::vec(("[a-z]{1,5}", proptest::bool::ANY, 0usize..3), 1..20)
        ) {
            let mut text = String::new();
            let mut expected = Vec::new();
            let mut line = 1;
            for (field, crlf, blanks) in &rows {
                expected.push(line);
                text.push_str(field);
                let end = if *crlf { "\r\n" } else { "\n" };
                text.push_str(end);
                line += 1;
                for _ in 0..*blanks {
                    text.push_str(end);
                    line += 1;
                }
            }
            prop_assert_eq!(record_lines(&text), expected);
        }
    }
}
