//! Reading profiles into cg_annotate's aggregates: per file (with its
//! functions), per function (with its files) and per (file, line).
//!
//! Entries are created exactly when cg_annotate's `defaultdict`s create
//! them, because entries with zero counts become visible with a zero
//! threshold. Counts read before any `fl=` go to scratch cost centres that
//! are never shown (cg_annotate's throwaway objects).
//!
//! Per-line counts are only needed for the files that get annotated, which
//! are known only once everything is read. So they are either collected
//! for every file while reading ([`Agg::read_body`] with `collect_lines`),
//! or, for inputs that can be read again, in a second pass for the
//! annotated files alone ([`Agg::read_lines`]): that keeps memory
//! proportional to the functions, not to the lines, of a large profile.
//! A file's line counts always add up to its outer total, since both are
//! switched by the same `fl=`/`fi=` lines.

use std::collections::BTreeSet;
use std::ffi::OsString;

use super::printer::{add_to, sub_from};
use crate::reader::{CgoutReader, Record};
use crate::subst::Subst;
use crate::tool::{read_error, FxHashMap, Interner, ToolError};

/// A cost centre id: an index into [`Agg::arena`] in units of the number
/// of events. Id 0 is the scratch cost centre.
pub type CcId = u32;
const SCRATCH: CcId = 0;

/// A "deep" cost centre: an outer total and named inner totals.
pub struct Dcc {
    /// The outer total.
    pub outer: CcId,
    /// Inner entries: (name id, cost centre), in creation order.
    pub inner: Vec<(u32, CcId)>,
}

/// Everything cg_annotate accumulates from its input files.
pub struct Agg {
    /// Number of events.
    pub n: usize,
    arena: Vec<i64>,
    /// Modified file names.
    pub files: Interner,
    /// Modified function names.
    pub funcs: Interner,
    /// File name id -> its deep cost centre (functions inside), if created.
    pub file_dcc: Vec<Option<u32>>,
    /// Function name id -> its deep cost centre (files inside), if created.
    pub func_dcc: Vec<Option<u32>>,
    /// All deep cost centres.
    pub dccs: Vec<Dcc>,
    inner_index: FxHashMap<(u32, u32), CcId>,
    /// File name id -> its per-line cost centres, if created.
    pub file_lines: Vec<Option<u32>>,
    /// Per-line cost centres of each file.
    pub line_maps: Vec<FxHashMap<i64, CcId>>,
    /// Modified file name id -> the original names that map to it.
    pub file_ofls: Vec<BTreeSet<Vec<u8>>>,
    /// Original file name -> modified file name id.
    ofl_cache: FxHashMap<Box<[u8]>, u32>,
    /// Original function name -> modified function name id.
    ofn_cache: FxHashMap<Box<[u8]>, u32>,
    mod_filename: Option<Subst>,
    mod_funcname: Option<Subst>,
    /// The sum of the `summary:` lines (the first file negated for a diff).
    pub summary: Vec<i64>,
}

/// The state of reading one file: where count lines go.
struct Cursor {
    mfl: u32,
    mfl_dcc: Option<u32>,
    mfn: Option<u32>,
    mfn_dcc: Option<u32>,
    fl_outer: CcId,
    fn_outer: CcId,
    fl_inner: CcId,
    fn_inner: CcId,
    line_map: Option<u32>,
}

impl Agg {
    /// Empty aggregates for `n` events.
    pub fn new(n: usize, mod_filename: Option<Subst>, mod_funcname: Option<Subst>) -> Agg {
        Agg {
            n,
            arena: vec![0; n],
            files: Interner::default(),
            funcs: Interner::default(),
            file_dcc: Vec::new(),
            func_dcc: Vec::new(),
            dccs: Vec::new(),
            inner_index: FxHashMap::default(),
            file_lines: Vec::new(),
            line_maps: Vec::new(),
            file_ofls: Vec::new(),
            ofl_cache: FxHashMap::default(),
            ofn_cache: FxHashMap::default(),
            mod_filename,
            mod_funcname,
            summary: vec![0; n],
        }
    }

    /// The counts of a cost centre.
    pub fn cc(&self, id: CcId) -> &[i64] {
        let start = id as usize * self.n;
        &self.arena[start..start + self.n]
    }

    fn cc_mut(&mut self, id: CcId) -> &mut [i64] {
        let start = id as usize * self.n;
        &mut self.arena[start..start + self.n]
    }

    fn new_cc(&mut self) -> CcId {
        let id = (self.arena.len() / self.n.max(1)) as CcId;
        self.arena.resize(self.arena.len() + self.n, 0);
        // With zero events every id would be 0; nothing is ever read then.
        id
    }

    fn new_dcc(&mut self) -> u32 {
        let outer = self.new_cc();
        self.dccs.push(Dcc {
            outer,
            inner: Vec::new(),
        });
        (self.dccs.len() - 1) as u32
    }

    fn intern_file(&mut self, name: &[u8]) -> u32 {
        let id = self.files.intern(name);
        if id as usize == self.file_dcc.len() {
            self.file_dcc.push(None);
            self.file_lines.push(None);
            self.file_ofls.push(BTreeSet::new());
        }
        id
    }

    fn intern_func(&mut self, name: &[u8]) -> u32 {
        let id = self.funcs.intern(name);
        if id as usize == self.func_dcc.len() {
            self.func_dcc.push(None);
        }
        id
    }

    /// The modified file name id for an original file name, recording the
    /// original name.
    fn map_file(&mut self, ofl: &[u8]) -> u32 {
        if let Some(&id) = self.ofl_cache.get(ofl) {
            return id;
        }
        let mfl = match &self.mod_filename {
            Some(s) => s.apply(ofl),
            None => ofl.to_vec(),
        };
        let id = self.intern_file(&mfl);
        self.file_ofls[id as usize].insert(ofl.to_vec());
        self.ofl_cache.insert(ofl.into(), id);
        id
    }

    fn map_func(&mut self, ofn: &[u8]) -> u32 {
        let Some(s) = &self.mod_funcname else {
            return self.intern_func(ofn);
        };
        if let Some(&id) = self.ofn_cache.get(ofn) {
            return id;
        }
        let mfn = s.apply(ofn);
        let id = self.intern_func(&mfn);
        self.ofn_cache.insert(ofn.into(), id);
        id
    }

    fn file_dcc_of(&mut self, mfl: u32) -> u32 {
        match self.file_dcc[mfl as usize] {
            Some(d) => d,
            None => {
                let d = self.new_dcc();
                self.file_dcc[mfl as usize] = Some(d);
                d
            }
        }
    }

    fn func_dcc_of(&mut self, mfn: u32) -> u32 {
        match self.func_dcc[mfn as usize] {
            Some(d) => d,
            None => {
                let d = self.new_dcc();
                self.func_dcc[mfn as usize] = Some(d);
                d
            }
        }
    }

    /// The inner cost centre `name` of deep cost centre `dcc` (scratch for
    /// a throwaway `dcc`).
    fn inner_of(&mut self, dcc: Option<u32>, name: u32) -> CcId {
        let Some(dcc) = dcc else {
            return SCRATCH;
        };
        if let Some(&cc) = self.inner_index.get(&(dcc, name)) {
            return cc;
        }
        let cc = self.new_cc();
        self.dccs[dcc as usize].inner.push((name, cc));
        self.inner_index.insert((dcc, name), cc);
        cc
    }

    fn line_map_of(&mut self, mfl: u32) -> u32 {
        match self.file_lines[mfl as usize] {
            Some(m) => m,
            None => {
                self.line_maps.push(FxHashMap::default());
                let m = (self.line_maps.len() - 1) as u32;
                self.file_lines[mfl as usize] = Some(m);
                m
            }
        }
    }

    /// Reads the body of one file whose header has been read. `negate`
    /// subtracts its counts (the first file of a diff); its `summary:`
    /// must still equal its own raw sum. With `collect_lines`, the
    /// per-line counts of every file are kept too.
    pub fn read_body<R: std::io::Read>(
        &mut self,
        path: &OsString,
        reader: &mut CgoutReader<R>,
        negate: bool,
        collect_lines: bool,
    ) -> Result<(), ToolError> {
        let n = self.n;
        let empty_file = self.intern_file(b"");
        let unspecified = b"<unspecified>";
        let mut cur = Cursor {
            mfl: empty_file,
            mfl_dcc: None,
            mfn: None,
            mfn_dcc: None,
            fl_outer: SCRATCH,
            fn_outer: SCRATCH,
            fl_inner: SCRATCH,
            fn_inner: SCRATCH,
            line_map: None,
        };
        let mut total = vec![0i64; n];
        let mut negated = vec![0i64; n];
        let mut summary_present = false;
        loop {
            let record = match reader.next_record() {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => return Err(read_error(path, e)),
            };
            match record {
                Record::Counts { line, counts } => {
                    add_to(&mut total, counts);
                    // Negate once rather than subtract everywhere.
                    let counts = if negate {
                        negated.copy_from_slice(counts);
                        negated.iter_mut().for_each(|c| *c = c.wrapping_neg());
                        &negated
                    } else {
                        counts
                    };
                    let targets = [cur.fl_outer, cur.fn_outer, cur.fl_inner, cur.fn_inner];
                    for t in targets {
                        let start = t as usize * n;
                        add_to(&mut self.arena[start..start + n], counts);
                    }
                    if collect_lines {
                        if let Some(m) = cur.line_map {
                            let id = match self.line_maps[m as usize].get(&line) {
                                Some(&id) => id,
                                None => {
                                    let id = self.new_cc();
                                    self.line_maps[m as usize].insert(line, id);
                                    id
                                }
                            };
                            add_to(self.cc_mut(id), counts);
                        }
                    }
                }
                Record::Fn(ofn) => {
                    let mfn = self.map_func(ofn);
                    let dcc = self.func_dcc_of(mfn);
                    cur.mfn = Some(mfn);
                    cur.mfn_dcc = Some(dcc);
                    cur.fn_outer = self.dccs[dcc as usize].outer;
                    cur.fl_inner = self.inner_of(cur.mfl_dcc, mfn);
                    cur.fn_inner = self.inner_of(Some(dcc), cur.mfl);
                }
                Record::Fl(ofl) => {
                    let mfl = self.map_file(ofl);
                    let mfn = self.intern_func(unspecified);
                    let fl_dcc = self.file_dcc_of(mfl);
                    let fn_dcc = self.func_dcc_of(mfn);
                    cur = Cursor {
                        mfl,
                        mfl_dcc: Some(fl_dcc),
                        mfn: Some(mfn),
                        mfn_dcc: Some(fn_dcc),
                        fl_outer: self.dccs[fl_dcc as usize].outer,
                        fn_outer: self.dccs[fn_dcc as usize].outer,
                        fl_inner: self.inner_of(Some(fl_dcc), mfn),
                        fn_inner: self.inner_of(Some(fn_dcc), mfl),
                        line_map: Some(self.line_map_of(mfl)),
                    };
                }
                Record::Fi(ofl) => {
                    // Older format: the file changes within the function.
                    let mfl = self.map_file(ofl);
                    let fl_dcc = self.file_dcc_of(mfl);
                    cur.mfl = mfl;
                    cur.mfl_dcc = Some(fl_dcc);
                    cur.fl_outer = self.dccs[fl_dcc as usize].outer;
                    cur.fl_inner = match cur.mfn {
                        Some(mfn) => self.inner_of(Some(fl_dcc), mfn),
                        None => SCRATCH,
                    };
                    cur.fn_inner = self.inner_of(cur.mfn_dcc, mfl);
                    cur.line_map = Some(self.line_map_of(mfl));
                }
                Record::Summary(counts) => {
                    summary_present = true;
                    if negate {
                        sub_from(&mut self.summary, counts);
                    } else {
                        add_to(&mut self.summary, counts);
                    }
                    if counts != total.as_slice() {
                        let msg = format!(
                            "`summary:` line doesn't match computed total\n- summary:  {}\n- computed: {}",
                            crate::pytext::int_list(counts),
                            crate::pytext::int_list(&total)
                        );
                        return Err(read_error(path, reader.error(msg)));
                    }
                }
            }
        }
        if !summary_present {
            return Err(read_error(
                path,
                reader.error("missing `summary:` line, aborting"),
            ));
        }
        Ok(())
    }

    /// The second pass: reads the body of one file again and collects the
    /// per-line counts of the files marked in `wanted` (by file id). The
    /// file must be the one [`Agg::read_body`] read, so every name is known.
    pub fn read_lines<R: std::io::Read>(
        &mut self,
        path: &OsString,
        reader: &mut CgoutReader<R>,
        negate: bool,
        wanted: &[bool],
    ) -> Result<(), ToolError> {
        let mut line_map: Option<u32> = None;
        loop {
            let record = match reader.next_record() {
                Ok(Some(r)) => r,
                Ok(None) => return Ok(()),
                Err(e) => return Err(read_error(path, e)),
            };
            match record {
                Record::Counts { line, counts } => {
                    let Some(m) = line_map else { continue };
                    let id = match self.line_maps[m as usize].get(&line) {
                        Some(&id) => id,
                        None => {
                            let id = self.new_cc();
                            self.line_maps[m as usize].insert(line, id);
                            id
                        }
                    };
                    let combine = if negate { sub_from } else { add_to };
                    combine(self.cc_mut(id), counts);
                }
                Record::Fl(ofl) | Record::Fi(ofl) => {
                    let mfl = self.map_file(ofl);
                    line_map = if wanted.get(mfl as usize).copied().unwrap_or(false) {
                        Some(self.line_map_of(mfl))
                    } else {
                        None
                    };
                }
                Record::Fn(_) | Record::Summary(_) => {}
            }
        }
    }
}
