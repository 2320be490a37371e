//! The in-memory form of a `cachegrind.out` file and its writer.
//!
//! The layout written is the one of Cachegrind (spec §5.2): `desc:` lines,
//! `cmd:`, `events:`, then `fl=`/`fn=`/count lines sorted by file, function
//! and line, then `summary:`.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};

use crate::reader::{CgoutReader, ReadError, Record};

/// Costs of one function, keyed by source line (0 = unknown line).
pub type LineCosts = BTreeMap<i64, Vec<i64>>;

/// Costs of one file, keyed by function name.
pub type FileCosts = BTreeMap<String, LineCosts>;

/// A whole profile: header, per-(file, function, line) costs and summary.
///
/// Maps are ordered byte-wise, which is the order Cachegrind writes records
/// in (`fl=???` after `/…` paths, `fn=(below main)` before `fn=???`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Profile {
    /// Text of each `desc:` line, without the `desc: ` prefix.
    pub desc: Vec<String>,
    /// Text of the `cmd:` line, without the `cmd: ` prefix.
    pub cmd: String,
    /// Event names, in file order.
    pub events: Vec<String>,
    /// The exact text after `events: `. Cachegrind writes a trailing space
    /// for some event sets, and byte-identical output needs it kept.
    pub events_text: String,
    /// Costs per file, function and line. Every cost vector has
    /// `events.len()` entries.
    pub costs: BTreeMap<String, FileCosts>,
}

impl Profile {
    /// An empty profile for `events`, with the `events:` text written as the
    /// names joined by single spaces.
    pub fn new(cmd: impl Into<String>, events: &[&str]) -> Self {
        Profile {
            desc: Vec::new(),
            cmd: cmd.into(),
            events: events.iter().map(|e| e.to_string()).collect(),
            events_text: events.join(" "),
            costs: BTreeMap::new(),
        }
    }

    /// Adds `counts` (one per event, missing trailing ones meaning zero) to
    /// the cost centre `(file, func, line)`, creating it if needed.
    pub fn add(&mut self, file: &str, func: &str, line: i64, counts: &[i64]) {
        let n = self.events.len();
        let funcs = match self.costs.get_mut(file) {
            Some(f) => f,
            None => self.costs.entry(file.to_string()).or_default(),
        };
        let lines = match funcs.get_mut(func) {
            Some(l) => l,
            None => funcs.entry(func.to_string()).or_default(),
        };
        let cc = lines.entry(line).or_insert_with(|| vec![0; n]);
        crate::cc::add_to(cc, counts);
    }

    /// Column sums over every cost centre.
    pub fn totals(&self) -> Vec<i64> {
        let mut sum = vec![0i64; self.events.len()];
        for cc in self
            .costs
            .values()
            .flat_map(|f| f.values())
            .flat_map(|l| l.values())
        {
            crate::cc::add_to(&mut sum, cc);
        }
        sum
    }

    /// Reads a `cachegrind.out` file (any the tools accept). Cost centres
    /// that repeat are summed; as in `cg_merge`, counts before the first
    /// `fl=` belong to file and function "", and a `fl=` without `fn=` to
    /// function `???`. The last `summary:` line must equal the totals.
    /// Names that are not UTF-8 are converted lossily.
    pub fn read_from<R: Read>(r: R) -> Result<Profile, ReadError> {
        let (mut reader, header) = CgoutReader::new(r)?;
        let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let mut p = Profile {
            desc: header.desc.iter().map(|d| lossy(d)).collect(),
            cmd: lossy(&header.cmd),
            events: header.events.clone(),
            events_text: lossy(&header.events_text),
            costs: BTreeMap::new(),
        };
        let (mut file, mut func) = (String::new(), String::new());
        let mut summary: Option<(Vec<i64>, u64)> = None;
        while let Some(record) = reader.next_record()? {
            match record {
                Record::Counts { line, counts } => p.add(&file, &func, line, counts),
                Record::Fl(name) => {
                    file = lossy(name);
                    func = "???".into();
                }
                Record::Fi(name) => file = lossy(name),
                Record::Fn(name) => func = lossy(name),
                Record::Summary(counts) => summary = Some((counts.to_vec(), reader.line_num())),
            }
        }
        let Some((summary, line)) = summary else {
            return Err(reader.error("missing `summary:` line, aborting"));
        };
        let totals = p.totals();
        if summary != totals {
            return Err(ReadError::Format {
                line,
                msg: format!(
                    "`summary:` line doesn't match computed total\n- summary:  {}\n- computed: {}",
                    crate::pytext::int_list(&summary),
                    crate::pytext::int_list(&totals)
                ),
            });
        }
        Ok(p)
    }

    /// Writes the profile in `cachegrind.out` format, with every count
    /// printed (zeros too) and a `summary:` line of the column sums.
    pub fn write_to<W: Write>(&self, w: &mut W) -> io::Result<()> {
        use crate::cc::{push_int, write_counts};
        // Lines are built in a buffer written out in large pieces: a
        // profile can have millions of counts.
        let mut buf = Vec::with_capacity(1 << 16);
        for d in &self.desc {
            writeln!(buf, "desc: {d}")?;
        }
        writeln!(buf, "cmd: {}", self.cmd)?;
        writeln!(buf, "events: {}", self.events_text)?;
        for (file, funcs) in &self.costs {
            writeln!(buf, "fl={file}")?;
            for (func, lines) in funcs {
                writeln!(buf, "fn={func}")?;
                for (&line, cc) in lines {
                    push_int(&mut buf, line);
                    write_counts(&mut buf, "", cc);
                    if buf.len() >= 1 << 16 {
                        w.write_all(&buf)?;
                        buf.clear();
                    }
                }
            }
        }
        write_counts(&mut buf, "summary:", &self.totals());
        w.write_all(&buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_sorted_records_and_summary() {
        let mut p = Profile::new("./t1 a", &["Ir", "Dr"]);
        p.add("???", "???", 0, &[5, 1]);
        p.add("/a.c", "main", 7, &[2]);
        p.add("/a.c", "(below main)", 3, &[1, 1]);
        p.add("/a.c", "main", 7, &[1, 4]);
        let mut out = Vec::new();
        p.write_to(&mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "cmd: ./t1 a\nevents: Ir Dr\nfl=/a.c\nfn=(below main)\n3 1 1\nfn=main\n7 3 4\n\
             fl=???\nfn=???\n0 5 1\nsummary: 9 6\n"
        );
    }

    #[test]
    fn reads_back_what_it_writes() {
        let mut p = Profile::new("./t1 a", &["Ir", "Dr"]);
        p.desc
            .push("I1 cache:         32768 B, 64 B, 8-way associative".into());
        p.events_text = "Ir Dr ".into();
        p.add("/a.c", "main", 7, &[2, -3]);
        p.add("???", "???", 0, &[5, 1]);
        let mut out = Vec::new();
        p.write_to(&mut out).unwrap();
        assert_eq!(Profile::read_from(&out[..]).unwrap(), p);
    }

    #[test]
    fn reading_sums_repeats_and_checks_the_summary() {
        let text = b"cmd: x\nevents: A\n1 1\nfl=f\n2 3\nfn=g\n2 4\n2 5\nsummary: 13\n";
        let p = Profile::read_from(&text[..]).unwrap();
        assert_eq!(p.costs[""][""][&1], vec![1]);
        assert_eq!(p.costs["f"]["???"][&2], vec![3]);
        assert_eq!(p.costs["f"]["g"][&2], vec![9]);
        let bad = b"cmd: x\nevents: A\nfl=f\n2 3\nsummary: 4\n";
        match Profile::read_from(&bad[..]) {
            Err(ReadError::Format { line: 5, msg }) => {
                assert!(msg.starts_with("`summary:` line doesn't match"))
            }
            other => panic!("{other:?}"),
        }
        let missing = b"cmd: x\nevents: A\n";
        assert!(matches!(
            Profile::read_from(&missing[..]),
            Err(ReadError::Format { line: 3, .. })
        ));
    }
}
