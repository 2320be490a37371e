//! `cg_diff`: the difference of two profiles at function granularity, as
//! the current Python `cg_diff` writes it (spec §8).
//!
//! Each file is summed per (modified file, modified function); line
//! numbers are dropped. The output holds `FILE2 - FILE1` for every key
//! seen in either file (zero differences included), sorted by file then
//! function, each with line number 0.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;

use crate::cc::{add_to, sub_from, write_counts};
use crate::pytext;
use crate::reader::{CgoutReader, Record};
use crate::subst::Subst;
use crate::tool::{open_input, read_error, FxHashMap, Interner, ToolError};

/// One file's per-function sums.
struct FileSums {
    cmd: Vec<u8>,
    events: Vec<String>,
    /// (file id, function id) -> offset in `arena`.
    keys: FxHashMap<(u32, u32), usize>,
    arena: Vec<i64>,
    summary: Vec<i64>,
}

/// Names shared by both files, with the modifications applied.
struct Names<'a> {
    files: Interner,
    funcs: Interner,
    mod_filename: Option<&'a Subst>,
    mod_funcname: Option<&'a Subst>,
}

impl Names<'_> {
    fn file(&mut self, name: &[u8]) -> u32 {
        match self.mod_filename {
            Some(s) => self.files.intern(&s.apply(name)),
            None => self.files.intern(name),
        }
    }

    fn func(&mut self, name: &[u8]) -> u32 {
        match self.mod_funcname {
            Some(s) => self.funcs.intern(&s.apply(name)),
            None => self.funcs.intern(name),
        }
    }
}

fn read_file(path: &OsString, names: &mut Names<'_>) -> Result<FileSums, ToolError> {
    let file = open_input(path)?;
    let (mut reader, header) = CgoutReader::new(file).map_err(|e| read_error(path, e))?;
    let n = header.events.len();
    let mut sums = FileSums {
        cmd: header.cmd,
        events: header.events,
        keys: FxHashMap::default(),
        arena: Vec::new(),
        summary: Vec::new(),
    };
    let mut summary: Option<Vec<i64>> = None;
    let mut fl = names.files.intern(b"");
    let mut key = (fl, names.funcs.intern(b""));
    let unknown_fn = names.funcs.intern(b"???");
    // Files repeat `fl=`/`fn=` names often: cache the modified ids.
    let mut file_cache: FxHashMap<Box<[u8]>, u32> = FxHashMap::default();
    let mut func_cache: FxHashMap<Box<[u8]>, u32> = FxHashMap::default();
    loop {
        let record = match reader.next_record() {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(e) => return Err(read_error(path, e)),
        };
        match record {
            Record::Counts { counts, .. } => {
                let slot = match sums.keys.get(&key) {
                    Some(&s) => s,
                    None => {
                        let s = sums.arena.len();
                        sums.arena.resize(s + n, 0);
                        sums.keys.insert(key, s);
                        s
                    }
                };
                add_to(&mut sums.arena[slot..slot + n], counts);
            }
            Record::Fn(name) => {
                let f = cached(&mut func_cache, name, |x| names.func(x));
                key = (fl, f);
            }
            Record::Fl(name) => {
                fl = cached(&mut file_cache, name, |x| names.file(x));
                key = (fl, unknown_fn);
            }
            Record::Fi(name) => {
                fl = cached(&mut file_cache, name, |x| names.file(x));
                key = (fl, key.1);
            }
            Record::Summary(counts) => summary = Some(counts.to_vec()),
        }
    }
    // `if not summary_cc`: an empty list (no events) counts as missing.
    let summary = match summary {
        Some(s) if !s.is_empty() => s,
        _ => {
            return Err(read_error(
                path,
                reader.error("missing `summary:` line, aborting"),
            ))
        }
    };
    let mut total = vec![0i64; n];
    for &slot in sums.keys.values() {
        add_to(&mut total, &sums.arena[slot..slot + n]);
    }
    if summary != total {
        let msg = format!(
            "`summary:` line doesn't match computed total\n- summary: {}\n- total:   {}",
            pytext::int_list(&summary),
            pytext::int_list(&total)
        );
        return Err(read_error(path, reader.error(msg)));
    }
    sums.summary = summary;
    Ok(sums)
}

/// Looks `name` up in `cache`, computing and remembering its id on a miss.
fn cached(cache: &mut FxHashMap<Box<[u8]>, u32>, name: &[u8], f: impl FnOnce(&[u8]) -> u32) -> u32 {
    if let Some(&id) = cache.get(name) {
        return id;
    }
    let id = f(name);
    cache.insert(name.into(), id);
    id
}

/// Writes `file2 - file1` to `w`.
pub fn diff(
    file1: &OsString,
    file2: &OsString,
    mod_filename: Option<&Subst>,
    mod_funcname: Option<&Subst>,
    w: &mut dyn Write,
) -> Result<(), ToolError> {
    let mut names = Names {
        files: Interner::default(),
        funcs: Interner::default(),
        mod_filename,
        mod_funcname,
    };
    let one = read_file(file1, &mut names)?;
    let mut two = read_file(file2, &mut names)?;
    if one.events != two.events {
        return Err(ToolError::Fatal("events in data files don't match".into()));
    }
    let n = one.events.len();
    for (key, &slot1) in &one.keys {
        let slot2 = match two.keys.get(key) {
            Some(&s) => s,
            None => {
                let s = two.arena.len();
                two.arena.resize(s + n, 0);
                two.keys.insert(*key, s);
                s
            }
        };
        sub_from(
            &mut two.arena[slot2..slot2 + n],
            &one.arena[slot1..slot1 + n],
        );
    }
    sub_from(&mut two.summary, &one.summary);

    let mut keys: Vec<(&[u8], &[u8], usize)> = two
        .keys
        .iter()
        .map(|(&(f, g), &slot)| (names.files.name(f), names.funcs.name(g), slot))
        .collect();
    keys.sort_unstable();

    let mut out = Vec::with_capacity(1 << 17);
    out.extend_from_slice(b"desc: Files compared:   ");
    out.extend_from_slice(file1.as_bytes());
    out.extend_from_slice(b"; ");
    out.extend_from_slice(file2.as_bytes());
    out.extend_from_slice(b"\ncmd: ");
    out.extend_from_slice(&one.cmd);
    out.extend_from_slice(b"; ");
    out.extend_from_slice(&two.cmd);
    out.extend_from_slice(b"\nevents:");
    for e in &one.events {
        out.push(b' ');
        out.extend_from_slice(e.as_bytes());
    }
    out.push(b'\n');
    for (fl, func, slot) in keys {
        out.extend_from_slice(b"fl=");
        out.extend_from_slice(fl);
        out.extend_from_slice(b"\nfn=");
        out.extend_from_slice(func);
        out.push(b'\n');
        write_counts(&mut out, "0", &two.arena[slot..slot + n]);
        if out.len() >= 1 << 16 {
            w.write_all(&out)?;
            out.clear();
        }
    }
    write_counts(&mut out, "summary:", &two.summary);
    w.write_all(&out)?;
    w.flush()?;
    Ok(())
}
