//! A C++ (Itanium ABI) demangler whose output is byte-for-byte what
//! libiberty's `cplus_demangle_v3(name, DMGL_PARAMS | DMGL_ANSI)` prints,
//! which is what Valgrind shows (it embeds libiberty's demangler).
//!
//! Why not a general-purpose demangler: per-function comparisons with
//! Valgrind's output need the *same* text, and libiberty has many
//! presentation choices of its own (`1u` literals, `(anonymous namespace)`,
//! `std::string` abbreviations, `>>` after an empty pack, clone suffixes,
//! `{lambda(int)#1}`, ...) that `cpp_demangle` does not share (it differed on
//! about 8% of the names of a Debian system). So this module follows
//! libiberty's algorithm closely: a parse into a component graph (with
//! libiberty's substitution table, limits and back-tracking) and a printer
//! with its modifier stack and template scopes. Quirks are kept on purpose
//! and marked as such, because reproducing them is the point.
//!
//! The libiberty reproduced is its January 2023 snapshot (Debian's
//! `libiberty-dev` 20230104, against which `tests/demangle_libiberty.rs` was
//! recorded). Later additions, `nx` (noexcept expressions) and `F`
//! (constrained friends), are left out so that such names stay raw as they
//! do there.
//!
//! Limits are libiberty's: names longer than 1024 bytes are not demangled,
//! printing recursion stops at 1024 levels. On top of that, output over
//! [`MAX_OUTPUT`] bytes or [`MAX_STEPS`] printing steps counts as a failure,
//! so a hostile name can neither exhaust memory nor hang the profiler
//! (libiberty would; no real symbol comes near these bounds).

/// libiberty's `DEMANGLE_RECURSION_LIMIT`.
const RECURSION_LIMIT: usize = 2048;
/// libiberty's `MAX_RECURSION_COUNT` for the printer.
const MAX_PRINT_RECURSION: usize = 1024;
/// Longest demangled name we produce (libiberty has no bound).
const MAX_OUTPUT: usize = 1 << 20;
/// Most component visits one print may make (libiberty has no bound).
const MAX_STEPS: u64 = 4_000_000;

/// Demangles an Itanium C++ name (`_Z...`), or `None` where libiberty
/// fails (and Valgrind shows the raw name).
pub(crate) fn demangle(mangled: &str) -> Option<String> {
    let s = mangled.as_bytes();
    // libiberty reads a C string: it ends at the first NUL.
    let s = match s.iter().position(|&b| b == 0) {
        Some(p) => &s[..p],
        None => s,
    };
    if s.len() < 2 || s[0] != b'_' || s[1] != b'Z' {
        return None;
    }
    // libiberty sizes its component array as twice the name length and
    // refuses names whose array would exceed the recursion limit.
    if 2 * s.len() > RECURSION_LIMIT {
        return None;
    }
    // An ambiguous old/new <unresolved-name> form is first read the new way;
    // if the whole name then fails, it is read again the old way.
    let mut unresolved_state = 1;
    loop {
        let mut p = Parser::new(s, unresolved_state);
        let mut dc = p.mangled_name(true);
        if p.peek() != 0 {
            dc = None;
        }
        if dc.is_none() && p.unresolved_name_state == -1 {
            unresolved_state = 0;
            continue;
        }
        let out = Printer::new(&p.nodes, s).print(dc?)?;
        return Some(match String::from_utf8(out) {
            Ok(s) => s,
            // Identifier lengths count bytes and may split a UTF-8 sequence.
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        });
    }
}

// ---------------------------------------------------------------------------
// Components

/// Component kinds (libiberty's `enum demangle_component_type`, less the
/// kinds only its D and Java front ends build).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum K {
    Name,
    QualName,
    LocalName,
    TypedName,
    Template,
    TemplateParam,
    FunctionParam,
    Ctor,
    Dtor,
    Vtable,
    Vtt,
    ConstructionVtable,
    Typeinfo,
    TypeinfoName,
    TypeinfoFn,
    Thunk,
    VirtualThunk,
    CovariantThunk,
    JavaClass,
    Guard,
    TlsInit,
    TlsWrapper,
    Reftemp,
    HiddenAlias,
    SubStd,
    Restrict,
    Volatile,
    Const,
    RestrictThis,
    VolatileThis,
    ConstThis,
    ReferenceThis,
    RvalueReferenceThis,
    TransactionSafe,
    Noexcept,
    ThrowSpec,
    VendorTypeQual,
    Pointer,
    Reference,
    RvalueReference,
    Complex,
    Imaginary,
    BuiltinType,
    ExtendedBuiltinType,
    VendorType,
    FunctionType,
    ArrayType,
    PtrmemType,
    VectorType,
    Arglist,
    TemplateArglist,
    TparmObj,
    InitializerList,
    Operator,
    ExtendedOperator,
    Cast,
    Conversion,
    Nullary,
    Unary,
    Binary,
    BinaryArgs,
    Trinary,
    TrinaryArg1,
    TrinaryArg2,
    Literal,
    LiteralNeg,
    VendorExpr,
    JavaResource,
    CompoundName,
    Character,
    Number,
    Decltype,
    Lambda,
    DefaultArg,
    UnnamedType,
    TransactionClone,
    NontransactionClone,
    PackExpansion,
    TaggedName,
    Clone,
    StructuredBinding,
    ModuleName,
    ModulePartition,
    ModuleEntity,
    ModuleInit,
    TemplateHead,
    TemplateTypeParm,
    TemplateNonTypeParm,
    TemplateTemplateParm,
    TemplatePackParm,
}

fn is_fnqual(k: K) -> bool {
    matches!(
        k,
        K::RestrictThis
            | K::VolatileThis
            | K::ConstThis
            | K::ReferenceThis
            | K::RvalueReferenceThis
            | K::TransactionSafe
            | K::Noexcept
            | K::ThrowSpec
    )
}

/// Text of a name component: a slice of the mangled name or a fixed string.
#[derive(Debug, Clone, Copy)]
enum Text {
    None,
    Src(u32, u32),
    Lit(&'static str),
}

/// One component. Children are arena indices; `l` also holds the single
/// operand of ctor/dtor/extended-operator/lambda/default-arg components
/// (their `name` / `sub` in libiberty), `num` their number.
#[derive(Debug, Clone, Copy)]
struct Node {
    k: K,
    l: Option<usize>,
    r: Option<usize>,
    num: i64,
    text: Text,
    /// Operator-table index, builtin-table index, character, or the
    /// extended builtin's suffix.
    aux: u8,
    /// Builtin-table index of an extended builtin.
    aux2: u8,
}

impl Node {
    fn new(k: K) -> Node {
        Node {
            k,
            l: None,
            r: None,
            num: 0,
            text: Text::None,
            aux: 0,
            aux2: 0,
        }
    }
}

/// How literals of a builtin type are printed (`enum d_builtin_type_print`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pr {
    Default,
    Int,
    Unsigned,
    Long,
    UnsignedLong,
    LongLong,
    UnsignedLongLong,
    Bool,
    Float,
    Void,
}

/// Builtin types by code (`a`..`z`, then the `D` extensions from 26).
const BUILTINS: [(&str, Pr); 36] = [
    ("signed char", Pr::Default),
    ("bool", Pr::Bool),
    ("char", Pr::Default),
    ("double", Pr::Float),
    ("long double", Pr::Float),
    ("float", Pr::Float),
    ("__float128", Pr::Float),
    ("unsigned char", Pr::Default),
    ("int", Pr::Int),
    ("unsigned int", Pr::Unsigned),
    ("", Pr::Default),
    ("long", Pr::Long),
    ("unsigned long", Pr::UnsignedLong),
    ("__int128", Pr::Default),
    ("unsigned __int128", Pr::Default),
    ("", Pr::Default),
    ("", Pr::Default),
    ("", Pr::Default),
    ("short", Pr::Default),
    ("unsigned short", Pr::Default),
    ("", Pr::Default),
    ("void", Pr::Void),
    ("wchar_t", Pr::Default),
    ("long long", Pr::LongLong),
    ("unsigned long long", Pr::UnsignedLongLong),
    ("...", Pr::Default),
    ("decimal32", Pr::Default),
    ("decimal64", Pr::Default),
    ("decimal128", Pr::Default),
    ("half", Pr::Float),
    ("char8_t", Pr::Default),
    ("char16_t", Pr::Default),
    ("char32_t", Pr::Default),
    ("decltype(nullptr)", Pr::Default),
    ("_Float", Pr::Float),
    ("std::bfloat16_t", Pr::Float),
];
const BT_NULLPTR: u8 = 33;
const BT_FLOAT_N: u8 = 34;
const BT_BFLOAT16: u8 = 35;

/// Operators: code, printed name (trailing space included where libiberty
/// has one), operand count.
const OPS: [(&str, &str, i64); 72] = [
    ("aN", "&=", 2),
    ("aS", "=", 2),
    ("aa", "&&", 2),
    ("ad", "&", 1),
    ("an", "&", 2),
    ("at", "alignof ", 1),
    ("aw", "co_await ", 1),
    ("az", "alignof ", 1),
    ("cc", "const_cast", 2),
    ("cl", "()", 2),
    ("cm", ",", 2),
    ("co", "~", 1),
    ("dV", "/=", 2),
    ("dX", "[...]=", 3),
    ("da", "delete[] ", 1),
    ("dc", "dynamic_cast", 2),
    ("de", "*", 1),
    ("di", "=", 2),
    ("dl", "delete ", 1),
    ("ds", ".*", 2),
    ("dt", ".", 2),
    ("dv", "/", 2),
    ("dx", "]=", 2),
    ("eO", "^=", 2),
    ("eo", "^", 2),
    ("eq", "==", 2),
    ("fL", "...", 3),
    ("fR", "...", 3),
    ("fl", "...", 2),
    ("fr", "...", 2),
    ("ge", ">=", 2),
    ("gs", "::", 1),
    ("gt", ">", 2),
    ("ix", "[]", 2),
    ("lS", "<<=", 2),
    ("le", "<=", 2),
    ("li", "operator\"\" ", 1),
    ("ls", "<<", 2),
    ("lt", "<", 2),
    ("mI", "-=", 2),
    ("mL", "*=", 2),
    ("mi", "-", 2),
    ("ml", "*", 2),
    ("mm", "--", 1),
    ("na", "new[]", 3),
    ("ne", "!=", 2),
    ("ng", "-", 1),
    ("nt", "!", 1),
    ("nw", "new", 3),
    ("oR", "|=", 2),
    ("oo", "||", 2),
    ("or", "|", 2),
    ("pL", "+=", 2),
    ("pl", "+", 2),
    ("pm", "->*", 2),
    ("pp", "++", 1),
    ("ps", "+", 1),
    ("pt", "->", 2),
    ("qu", "?", 3),
    ("rM", "%=", 2),
    ("rS", ">>=", 2),
    ("rc", "reinterpret_cast", 2),
    ("rm", "%", 2),
    ("rs", ">>", 2),
    ("sP", "sizeof...", 1),
    ("sZ", "sizeof...", 1),
    ("sc", "static_cast", 2),
    ("ss", "<=>", 2),
    ("st", "sizeof ", 1),
    ("sz", "sizeof ", 1),
    ("tr", "throw", 0),
    ("tw", "throw ", 1),
];

/// Standard substitutions: code, short form, full form (used before a
/// constructor or destructor), and the class name a following ctor/dtor takes.
const STD_SUBS: [(u8, &str, &str, Option<&str>); 7] = [
    (b't', "std", "std", None),
    (b'a', "std::allocator", "std::allocator", Some("allocator")),
    (
        b'b',
        "std::basic_string",
        "std::basic_string",
        Some("basic_string"),
    ),
    (
        b's',
        "std::string",
        "std::basic_string<char, std::char_traits<char>, std::allocator<char> >",
        Some("basic_string"),
    ),
    (
        b'i',
        "std::istream",
        "std::basic_istream<char, std::char_traits<char> >",
        Some("basic_istream"),
    ),
    (
        b'o',
        "std::ostream",
        "std::basic_ostream<char, std::char_traits<char> >",
        Some("basic_ostream"),
    ),
    (
        b'd',
        "std::iostream",
        "std::basic_iostream<char, std::char_traits<char> >",
        Some("basic_iostream"),
    ),
];

fn is_digit(c: u8) -> bool {
    c.is_ascii_digit()
}
fn is_lower(c: u8) -> bool {
    c.is_ascii_lowercase()
}
fn is_upper(c: u8) -> bool {
    c.is_ascii_uppercase()
}

// ---------------------------------------------------------------------------
// Parser

/// Where the component under a chain of qualifiers goes: the chain's root
/// itself (no qualifier) or the left operand of the innermost qualifier.
#[derive(Clone, Copy)]
enum Slot {
    Root,
    LeftOf(usize),
}

struct Parser<'a> {
    s: &'a [u8],
    n: usize,
    nodes: Vec<Node>,
    /// Components allocated so far as libiberty counts them (back-tracking
    /// gives slots back); bounded by `max_nodes`.
    count: usize,
    max_nodes: usize,
    subs: Vec<usize>,
    max_subs: usize,
    /// The last source name, which a following constructor/destructor names.
    last_name: Option<usize>,
    is_expression: bool,
    is_conversion: bool,
    recursion_level: usize,
    unresolved_name_state: i32,
}

impl<'a> Parser<'a> {
    fn new(s: &'a [u8], unresolved_name_state: i32) -> Self {
        Parser {
            s,
            n: 0,
            nodes: Vec::with_capacity(s.len()),
            count: 0,
            max_nodes: 2 * s.len(),
            subs: Vec::new(),
            max_subs: s.len(),
            last_name: None,
            is_expression: false,
            is_conversion: false,
            recursion_level: 0,
            unresolved_name_state,
        }
    }

    fn at(&self, i: usize) -> u8 {
        self.s.get(i).copied().unwrap_or(0)
    }
    fn peek(&self) -> u8 {
        self.at(self.n)
    }
    fn peek_next(&self) -> u8 {
        self.at(self.n + 1)
    }
    fn next_char(&mut self) -> u8 {
        let c = self.peek();
        if c != 0 {
            self.n += 1;
        }
        c
    }
    fn check(&mut self, c: u8) -> bool {
        if self.peek() == c {
            self.n += 1;
            true
        } else {
            false
        }
    }
    fn advance(&mut self, k: usize) {
        self.n += k;
    }

    fn k(&self, i: usize) -> K {
        self.nodes[i].k
    }

    fn alloc(&mut self, node: Node) -> Option<usize> {
        if self.count >= self.max_nodes {
            return None;
        }
        self.count += 1;
        self.nodes.push(node);
        Some(self.nodes.len() - 1)
    }

    /// `d_make_comp`: a component with operands, or `None` when an operand
    /// its kind requires is missing (which is how failures propagate).
    fn comp(&mut self, k: K, l: Option<usize>, r: Option<usize>) -> Option<usize> {
        use K::*;
        let ok = match k {
            QualName | LocalName | TypedName | TaggedName | Template | ConstructionVtable
            | VendorTypeQual | PtrmemType | Unary | Binary | BinaryArgs | Trinary | TrinaryArg1
            | Literal | LiteralNeg | VendorExpr | CompoundName | VectorType | Clone
            | ModuleEntity => l.is_some() && r.is_some(),
            Vtable | Vtt | Typeinfo | TypeinfoName | TypeinfoFn | Thunk | VirtualThunk
            | CovariantThunk | JavaClass | Guard | TlsInit | TlsWrapper | Reftemp | HiddenAlias
            | TransactionClone | NontransactionClone | Pointer | Reference | RvalueReference
            | Complex | Imaginary | VendorType | Cast | Conversion | JavaResource | Decltype
            | PackExpansion | Nullary | TrinaryArg2 | TparmObj | StructuredBinding | ModuleInit
            | TemplateHead | TemplateNonTypeParm | TemplateTemplateParm | TemplatePackParm => {
                l.is_some()
            }
            ArrayType | InitializerList | ModuleName | ModulePartition => r.is_some(),
            FunctionType | Restrict | Volatile | Const | Arglist | TemplateArglist
            | TemplateTypeParm | RestrictThis | VolatileThis | ConstThis | ReferenceThis
            | RvalueReferenceThis | TransactionSafe | Noexcept | ThrowSpec => true,
            _ => false,
        };
        if !ok {
            return None;
        }
        let mut node = Node::new(k);
        node.l = l;
        node.r = r;
        self.alloc(node)
    }

    fn make_name_src(&mut self, start: usize, len: usize) -> Option<usize> {
        // libiberty allocates the slot, then refuses an empty name.
        if self.count >= self.max_nodes {
            return None;
        }
        if len == 0 {
            self.count += 1;
            return None;
        }
        let mut node = Node::new(K::Name);
        node.text = Text::Src(start as u32, len as u32);
        self.alloc(node)
    }

    fn make_name_lit(&mut self, s: &'static str) -> Option<usize> {
        let mut node = Node::new(K::Name);
        node.text = Text::Lit(s);
        self.alloc(node)
    }

    fn make_sub(&mut self, s: &'static str) -> Option<usize> {
        let mut node = Node::new(K::SubStd);
        node.text = Text::Lit(s);
        self.alloc(node)
    }

    fn make_builtin(&mut self, index: u8) -> Option<usize> {
        let mut node = Node::new(K::BuiltinType);
        node.aux = index;
        self.alloc(node)
    }

    fn make_num(&mut self, k: K, num: i64) -> Option<usize> {
        let mut node = Node::new(k);
        node.num = num;
        self.alloc(node)
    }

    fn make_with_sub(&mut self, k: K, num: i64, sub: Option<usize>) -> Option<usize> {
        let mut node = Node::new(k);
        node.num = num;
        node.l = sub;
        self.alloc(node)
    }

    fn add_subst(&mut self, dc: Option<usize>) -> bool {
        match dc {
            Some(d) if self.subs.len() < self.max_subs => {
                self.subs.push(d);
                true
            }
            _ => false,
        }
    }

    fn fill(&mut self, root: &mut Option<usize>, slot: Slot, v: Option<usize>) {
        match slot {
            Slot::Root => *root = v,
            Slot::LeftOf(q) => self.nodes[q].l = v,
        }
    }

    /// `<mangled-name> ::= _Z <encoding> [<clone-suffix>]*`
    fn mangled_name(&mut self, top: bool) -> Option<usize> {
        // Below the top level the `_` may be missing (an old g++ bug).
        if !self.check(b'_') && top {
            return None;
        }
        if !self.check(b'Z') {
            return None;
        }
        let mut p = self.encoding(top);
        if top {
            while self.peek() == b'.'
                && (is_lower(self.peek_next())
                    || self.peek_next() == b'_'
                    || is_digit(self.peek_next()))
            {
                p = self.clone_suffix(p);
            }
        }
        p
    }

    fn has_return_type(&self, dc: Option<usize>) -> bool {
        let Some(d) = dc else { return false };
        match self.k(d) {
            K::LocalName => self.has_return_type(self.nodes[d].r),
            K::Template => !self.is_ctor_dtor_or_conversion(self.nodes[d].l),
            k if is_fnqual(k) => self.has_return_type(self.nodes[d].l),
            _ => false,
        }
    }

    fn is_ctor_dtor_or_conversion(&self, dc: Option<usize>) -> bool {
        let Some(d) = dc else { return false };
        match self.k(d) {
            K::QualName | K::LocalName => self.is_ctor_dtor_or_conversion(self.nodes[d].r),
            K::Ctor | K::Dtor | K::Conversion => true,
            _ => false,
        }
    }

    /// `<encoding> ::= <name> <bare-function-type> | <name> | <special-name>`
    fn encoding(&mut self, top: bool) -> Option<usize> {
        let peek = self.peek();
        if peek == b'G' || peek == b'T' {
            return self.special_name();
        }
        let dc = self.name(false)?;
        let peek = self.peek();
        if peek != 0 && peek != b'E' {
            let has_ret = self.has_return_type(Some(dc));
            let ftype = self.bare_function_type(has_ret)?;
            // A local entity's enclosing function is shown without its
            // return type.
            if !top && self.k(dc) == K::LocalName && self.k(ftype) == K::FunctionType {
                self.nodes[ftype].l = None;
            }
            return self.comp(K::TypedName, Some(dc), Some(ftype));
        }
        Some(dc)
    }

    fn abi_tags(&mut self, mut dc: Option<usize>) -> Option<usize> {
        // ABI tags do not become the name a constructor refers to.
        let hold = self.last_name;
        while self.peek() == b'B' {
            self.advance(1);
            let tag = self.source_name();
            dc = self.comp(K::TaggedName, dc, tag);
        }
        self.last_name = hold;
        dc
    }

    /// `<name>`: nested, local, unscoped or unscoped-template name.
    fn name(&mut self, substable: bool) -> Option<usize> {
        let peek = self.peek();
        let mut dc = None;
        let mut module = None;
        let mut subst = false;
        match peek {
            b'N' => dc = self.nested_name(),
            b'Z' => dc = self.local_name(),
            b'U' => dc = self.unqualified_name(None, None),
            _ => {
                if peek == b'S' {
                    if self.peek_next() == b't' {
                        self.advance(2);
                        dc = self.make_name_lit("std");
                    }
                    if self.peek() == b'S' {
                        let m = self.substitution(false)?;
                        if !matches!(self.k(m), K::ModuleName | K::ModulePartition) {
                            if dc.is_some() {
                                return None;
                            }
                            subst = true;
                            dc = Some(m);
                        } else {
                            module = Some(m);
                        }
                    }
                }
                if !subst {
                    dc = self.unqualified_name(dc, module);
                }
                if self.peek() == b'I' {
                    // An unscoped template name is a substitution candidate.
                    if !subst && !self.add_subst(dc) {
                        return None;
                    }
                    let args = self.template_args();
                    dc = self.comp(K::Template, dc, args);
                    subst = false;
                }
            }
        }
        if substable && !subst && !self.add_subst(dc) {
            return None;
        }
        dc
    }

    fn nested_name(&mut self) -> Option<usize> {
        if !self.check(b'N') {
            return None;
        }
        let (mut ret, slot) = self.cv_qualifiers(true)?;
        let rqual = self.ref_qualifier(None);
        let pre = self.prefix(true);
        self.fill(&mut ret, slot, pre);
        pre?;
        if let Some(rq) = rqual {
            self.nodes[rq].l = ret;
            ret = Some(rq);
        }
        if !self.check(b'E') {
            return None;
        }
        ret
    }

    fn prefix(&mut self, substable: bool) -> Option<usize> {
        let mut ret: Option<usize> = None;
        loop {
            let peek = self.peek();
            if peek == b'D' && (self.peek_next() == b'T' || self.peek_next() == b't') {
                if ret.is_some() {
                    return None;
                }
                ret = self.type_();
            } else if peek == b'I' {
                ret?;
                let dc = self.template_args()?;
                ret = self.comp(K::Template, ret, Some(dc));
            } else if peek == b'T' {
                if ret.is_some() {
                    return None;
                }
                ret = self.template_param();
            } else if peek == b'M' {
                // A lambda's initializer scope, already a substitution.
                self.advance(1);
                continue;
            } else {
                let mut module = None;
                if peek == b'S' {
                    let m = self.substitution(true)?;
                    if !matches!(self.k(m), K::ModuleName | K::ModulePartition) {
                        if ret.is_some() {
                            return None;
                        }
                        ret = Some(m);
                        continue;
                    }
                    module = Some(m);
                }
                ret = self.unqualified_name(ret, module);
            }
            if ret.is_none() || self.peek() == b'E' {
                break;
            }
            if substable && !self.add_subst(ret) {
                return None;
            }
        }
        ret
    }

    fn maybe_module_name(&mut self, name: &mut Option<usize>) -> bool {
        while self.peek() == b'W' {
            self.advance(1);
            let mut code = K::ModuleName;
            if self.peek() == b'P' {
                code = K::ModulePartition;
                self.advance(1);
            }
            let sn = self.source_name();
            *name = self.comp(code, *name, sn);
            if name.is_none() || !self.add_subst(*name) {
                return false;
            }
        }
        true
    }

    fn unqualified_name(
        &mut self,
        scope: Option<usize>,
        mut module: Option<usize>,
    ) -> Option<usize> {
        if !self.maybe_module_name(&mut module) {
            return None;
        }
        // (Later libiberty also reads `F` here, for constrained friends; see
        // the module documentation.)
        let peek = self.peek();
        let mut ret;
        if is_digit(peek) {
            ret = self.source_name();
        } else if is_lower(peek) {
            let was_expr = self.is_expression;
            if peek == b'o' && self.peek_next() == b'n' {
                self.advance(2);
                // `cv` here names a conversion operator.
                self.is_expression = false;
            }
            ret = self.operator_name();
            self.is_expression = was_expr;
            if let Some(r) = ret {
                if self.k(r) == K::Operator && OPS[self.nodes[r].aux as usize].0 == "li" {
                    let sn = self.source_name();
                    ret = self.comp(K::Unary, ret, sn);
                }
            }
        } else if peek == b'D' && self.peek_next() == b'C' {
            // Structured binding.
            self.advance(2);
            let mut prev: Option<usize> = None;
            ret = None;
            loop {
                let sn = self.source_name();
                let next = self.comp(K::StructuredBinding, sn, None);
                match prev {
                    Some(p) => self.nodes[p].r = next,
                    None => ret = next,
                }
                prev = next;
                if prev.is_none() || self.peek() == b'E' {
                    break;
                }
            }
            if prev.is_some() {
                self.advance(1);
            } else {
                ret = None;
            }
        } else if peek == b'C' || peek == b'D' {
            ret = self.ctor_dtor_name();
        } else if peek == b'L' {
            self.advance(1);
            ret = self.source_name();
            ret?;
            if !self.discriminator() {
                return None;
            }
        } else if peek == b'U' {
            ret = match self.peek_next() {
                b'l' => self.lambda(),
                b't' => self.unnamed_type(),
                _ => return None,
            };
        } else {
            return None;
        }
        if module.is_some() {
            ret = self.comp(K::ModuleEntity, ret, module);
        }
        if self.peek() == b'B' {
            ret = self.abi_tags(ret);
        }
        if scope.is_some() {
            ret = self.comp(K::QualName, scope, ret);
        }
        ret
    }

    fn source_name(&mut self) -> Option<usize> {
        let len = self.number();
        if len <= 0 {
            return None;
        }
        let ret = self.identifier(len as usize);
        self.last_name = ret;
        ret
    }

    /// `[n] <decimal>`, -1 on `int` overflow (libiberty's `d_number`).
    fn number(&mut self) -> i32 {
        let mut negative = false;
        let mut peek = self.peek();
        if peek == b'n' {
            negative = true;
            self.advance(1);
            peek = self.peek();
        }
        let mut ret: i32 = 0;
        loop {
            if !is_digit(peek) {
                return if negative { -ret } else { ret };
            }
            let d = (peek - b'0') as i32;
            if ret > (i32::MAX - d) / 10 {
                return -1;
            }
            ret = ret * 10 + d;
            self.advance(1);
            peek = self.peek();
        }
    }

    fn number_component(&mut self) -> Option<usize> {
        if self.count >= self.max_nodes {
            return None;
        }
        let v = self.number();
        self.make_num(K::Number, v as i64)
    }

    fn identifier(&mut self, len: usize) -> Option<usize> {
        let start = self.n;
        if self.s.len() - start < len {
            return None;
        }
        self.advance(len);
        let name = &self.s[start..start + len];
        // g++'s encoding of the anonymous namespace.
        if len >= 10 && name.starts_with(b"_GLOBAL_") {
            let c = name[8];
            if (c == b'.' || c == b'_' || c == b'$') && name[9] == b'N' {
                return self.make_name_lit("(anonymous namespace)");
            }
        }
        self.make_name_src(start, len)
    }

    fn operator_name(&mut self) -> Option<usize> {
        let c1 = self.next_char();
        let c2 = self.next_char();
        if c1 == b'v' && is_digit(c2) {
            let name = self.source_name()?;
            return self.make_with_sub(K::ExtendedOperator, (c2 - b'0') as i64, Some(name));
        }
        if c1 == b'c' && c2 == b'v' {
            let was = self.is_conversion;
            self.is_conversion = !self.is_expression;
            let ty = self.type_();
            let res = if self.is_conversion {
                self.comp(K::Conversion, ty, None)
            } else {
                self.comp(K::Cast, ty, None)
            };
            self.is_conversion = was;
            return res;
        }
        let i = OPS.iter().position(|op| op.0.as_bytes() == [c1, c2])?;
        let mut node = Node::new(K::Operator);
        node.aux = i as u8;
        self.alloc(node)
    }

    fn java_resource(&mut self) -> Option<usize> {
        let mut len = self.number();
        if len <= 1 {
            return None;
        }
        if self.next_char() != b'_' {
            return None;
        }
        len -= 1;
        let mut p: Option<usize> = None;
        while len > 0 {
            let c = self.peek();
            if c == 0 {
                return None;
            }
            let next;
            if c == b'$' {
                let ch = match self.at(self.n + 1) {
                    b'S' => b'/',
                    b'_' => b'.',
                    b'$' => b'$',
                    _ => return None,
                };
                let mut node = Node::new(K::Character);
                node.aux = ch;
                next = self.alloc(node);
                self.advance(2);
                len -= 2;
            } else {
                let mut i = 0usize;
                while (i as i32) < len && self.at(self.n + i) != 0 && self.at(self.n + i) != b'$' {
                    i += 1;
                }
                next = self.make_name_src(self.n, i);
                self.advance(i);
                len -= i as i32;
            }
            next?;
            p = match p {
                None => next,
                Some(_) => Some(self.comp(K::CompoundName, p, next)?),
            };
        }
        self.comp(K::JavaResource, p, None)
    }

    fn special_name(&mut self) -> Option<usize> {
        if self.check(b'T') {
            let k = match self.next_char() {
                b'V' => K::Vtable,
                b'T' => K::Vtt,
                b'I' => K::Typeinfo,
                b'S' => K::TypeinfoName,
                b'F' => K::TypeinfoFn,
                b'J' => K::JavaClass,
                b'h' => {
                    if !self.call_offset(b'h') {
                        return None;
                    }
                    let e = self.encoding(false);
                    return self.comp(K::Thunk, e, None);
                }
                b'v' => {
                    if !self.call_offset(b'v') {
                        return None;
                    }
                    let e = self.encoding(false);
                    return self.comp(K::VirtualThunk, e, None);
                }
                b'c' => {
                    if !self.call_offset(0) || !self.call_offset(0) {
                        return None;
                    }
                    let e = self.encoding(false);
                    return self.comp(K::CovariantThunk, e, None);
                }
                b'C' => {
                    let derived = self.type_();
                    if self.number() < 0 || !self.check(b'_') {
                        return None;
                    }
                    let base = self.type_();
                    return self.comp(K::ConstructionVtable, base, derived);
                }
                b'H' => {
                    let n = self.name(false);
                    return self.comp(K::TlsInit, n, None);
                }
                b'W' => {
                    let n = self.name(false);
                    return self.comp(K::TlsWrapper, n, None);
                }
                b'A' => {
                    let a = self.template_arg();
                    return self.comp(K::TparmObj, a, None);
                }
                _ => return None,
            };
            let t = self.type_();
            self.comp(k, t, None)
        } else if self.check(b'G') {
            match self.next_char() {
                b'V' => {
                    let n = self.name(false);
                    self.comp(K::Guard, n, None)
                }
                b'R' => {
                    let n = self.name(false);
                    let num = self.number_component();
                    self.comp(K::Reftemp, n, num)
                }
                b'A' => {
                    let e = self.encoding(false);
                    self.comp(K::HiddenAlias, e, None)
                }
                b'I' => {
                    let mut m = None;
                    if !self.maybe_module_name(&mut m) || m.is_none() {
                        return None;
                    }
                    self.comp(K::ModuleInit, m, None)
                }
                b'T' => {
                    let k = if self.next_char() == b'n' {
                        K::NontransactionClone
                    } else {
                        K::TransactionClone
                    };
                    let e = self.encoding(false);
                    self.comp(k, e, None)
                }
                b'r' => self.java_resource(),
                _ => None,
            }
        } else {
            None
        }
    }

    fn call_offset(&mut self, mut c: u8) -> bool {
        if c == 0 {
            c = self.next_char();
        }
        if c == b'h' {
            self.number();
        } else if c == b'v' {
            self.number();
            if !self.check(b'_') {
                return false;
            }
            self.number();
        } else {
            return false;
        }
        self.check(b'_')
    }

    fn ctor_dtor_name(&mut self) -> Option<usize> {
        match self.peek() {
            b'C' => {
                let mut inheriting = false;
                if self.peek_next() == b'I' {
                    inheriting = true;
                    self.advance(1);
                }
                let kind = match self.peek_next() {
                    c @ b'1'..=b'5' => c - b'0',
                    _ => return None,
                };
                self.advance(2);
                if inheriting {
                    // The base type is read (and may change `last_name`) but
                    // not shown.
                    self.type_();
                }
                let name = self.last_name?;
                self.make_with_sub(K::Ctor, kind as i64, Some(name))
            }
            b'D' => {
                let kind = match self.peek_next() {
                    c @ (b'0' | b'1' | b'2' | b'4' | b'5') => c - b'0',
                    _ => return None,
                };
                self.advance(2);
                let name = self.last_name?;
                self.make_with_sub(K::Dtor, kind as i64, Some(name))
            }
            _ => None,
        }
    }

    fn next_is_type_qual(&self) -> bool {
        match self.peek() {
            b'r' | b'V' | b'K' => true,
            b'D' => matches!(self.peek_next(), b'x' | b'o' | b'O' | b'w'),
            _ => false,
        }
    }

    /// `<type>`
    fn type_(&mut self) -> Option<usize> {
        if self.next_is_type_qual() {
            // All qualifiers are read at once: the ABI makes only the
            // unqualified and the fully qualified type substitutable.
            let (mut root, slot) = self.cv_qualifiers(false)?;
            let inner = if self.peek() == b'F' {
                // Qualifiers before a function type apply to `this`.
                self.function_type()
            } else {
                self.type_()
            };
            self.fill(&mut root, slot, inner);
            let inner = inner?;
            if matches!(self.k(inner), K::RvalueReferenceThis | K::ReferenceThis) {
                // Move the ref-qualifier outside the cv-qualifiers so they
                // print in order.
                let f = self.nodes[inner].l;
                self.nodes[inner].l = root;
                root = Some(inner);
                self.fill(&mut root, slot, f);
            }
            if !self.add_subst(root) {
                return None;
            }
            return root;
        }

        let mut can_subst = true;
        let peek = self.peek();
        let mut ret;
        match peek {
            b'a'..=b'j' | b'l' | b'm' | b'n' | b'o' | b's' | b't' | b'v'..=b'z' => {
                ret = self.make_builtin(peek - b'a');
                can_subst = false;
                self.advance(1);
            }
            b'u' => {
                self.advance(1);
                let sn = self.source_name();
                ret = self.comp(K::VendorType, sn, None);
            }
            b'F' => ret = self.function_type(),
            b'A' => ret = self.array_type(),
            b'M' => ret = self.pointer_to_member_type(),
            b'T' => {
                ret = self.template_param();
                if self.peek() == b'I' {
                    if !self.is_conversion {
                        // A template template parameter with its arguments.
                        if !self.add_subst(ret) {
                            return None;
                        }
                        let args = self.template_args();
                        ret = self.comp(K::Template, ret, args);
                    } else {
                        // In a conversion operator's type the arguments may
                        // belong to the enclosing template instead: take
                        // them only if a second argument list follows.
                        let cp = (self.n, self.count, self.subs.len());
                        let args = self.template_args();
                        if self.peek() == b'I' {
                            if !self.add_subst(ret) {
                                return None;
                            }
                            ret = self.comp(K::Template, ret, args);
                        } else {
                            self.n = cp.0;
                            self.count = cp.1;
                            self.subs.truncate(cp.2);
                        }
                    }
                }
            }
            b'O' | b'P' | b'R' | b'C' | b'G' => {
                self.advance(1);
                let k = match peek {
                    b'O' => K::RvalueReference,
                    b'P' => K::Pointer,
                    b'R' => K::Reference,
                    b'C' => K::Complex,
                    _ => K::Imaginary,
                };
                let t = self.type_();
                ret = self.comp(k, t, None);
            }
            b'U' => {
                self.advance(1);
                let mut q = self.source_name();
                if self.peek() == b'I' {
                    let a = self.template_args();
                    q = self.comp(K::Template, q, a);
                }
                let t = self.type_();
                ret = self.comp(K::VendorTypeQual, t, q);
            }
            b'D' => {
                can_subst = false;
                self.advance(1);
                match self.next_char() {
                    b'T' | b't' => {
                        let e = self.expression();
                        ret = self.comp(K::Decltype, e, None);
                        if ret.is_some() && self.next_char() != b'E' {
                            ret = None;
                        }
                        can_subst = true;
                    }
                    b'p' => {
                        let t = self.type_();
                        ret = self.comp(K::PackExpansion, t, None);
                        can_subst = true;
                    }
                    b'a' => ret = self.make_name_lit("auto"),
                    b'c' => ret = self.make_name_lit("decltype(auto)"),
                    b'f' => ret = self.make_builtin(26),
                    b'd' => ret = self.make_builtin(27),
                    b'e' => ret = self.make_builtin(28),
                    b'h' => ret = self.make_builtin(29),
                    b'u' => ret = self.make_builtin(30),
                    b's' => ret = self.make_builtin(31),
                    b'i' => ret = self.make_builtin(32),
                    b'F' => {
                        let arg = self.number();
                        if self.peek() == b'b' {
                            if arg != 16 {
                                return None;
                            }
                            self.advance(1);
                            ret = self.make_builtin(BT_BFLOAT16);
                        } else {
                            let suffix = if self.peek() == b'x' { b'x' } else { 0 };
                            if suffix == 0 && self.peek() != b'_' {
                                return None;
                            }
                            let mut node = Node::new(K::ExtendedBuiltinType);
                            node.aux2 = BT_FLOAT_N;
                            // libiberty keeps the width in a `short`.
                            node.num = arg as i16 as i64;
                            node.aux = suffix;
                            ret = self.alloc(node);
                            self.advance(1);
                        }
                    }
                    b'v' => {
                        ret = self.vector_type();
                        can_subst = true;
                    }
                    b'n' => ret = self.make_builtin(BT_NULLPTR),
                    _ => return None,
                }
            }
            _ => return self.name(true),
        }
        if can_subst && !self.add_subst(ret) {
            return None;
        }
        ret
    }

    /// `<CV-qualifiers>` (and the function-type qualifiers that may mix
    /// with them): returns the chain's root and where its operand goes.
    fn cv_qualifiers(&mut self, member_fn: bool) -> Option<(Option<usize>, Slot)> {
        let mut root = None;
        let mut slot = Slot::Root;
        let mut quals = Vec::new();
        let mut peek = self.peek();
        while self.next_is_type_qual() {
            let mut right = None;
            self.advance(1);
            let k = match peek {
                b'r' if member_fn => K::RestrictThis,
                b'r' => K::Restrict,
                b'V' if member_fn => K::VolatileThis,
                b'V' => K::Volatile,
                b'K' if member_fn => K::ConstThis,
                b'K' => K::Const,
                _ => match self.next_char() {
                    b'x' => K::TransactionSafe,
                    c @ (b'o' | b'O') => {
                        if c == b'O' {
                            right = Some(self.expression()?);
                            if !self.check(b'E') {
                                return None;
                            }
                        }
                        K::Noexcept
                    }
                    b'w' => {
                        right = Some(self.parmlist()?);
                        if !self.check(b'E') {
                            return None;
                        }
                        K::ThrowSpec
                    }
                    _ => return None,
                },
            };
            let q = self.comp(k, None, right)?;
            self.fill(&mut root, slot, Some(q));
            slot = Slot::LeftOf(q);
            quals.push(q);
            peek = self.peek();
        }
        if !member_fn && peek == b'F' {
            // Qualifiers of a function type qualify its `this`.
            for q in quals {
                self.nodes[q].k = match self.nodes[q].k {
                    K::Restrict => K::RestrictThis,
                    K::Volatile => K::VolatileThis,
                    K::Const => K::ConstThis,
                    k => k,
                };
            }
        }
        Some((root, slot))
    }

    fn ref_qualifier(&mut self, sub: Option<usize>) -> Option<usize> {
        let k = match self.peek() {
            b'R' => K::ReferenceThis,
            b'O' => K::RvalueReferenceThis,
            _ => return sub,
        };
        self.advance(1);
        self.comp(k, sub, None)
    }

    fn function_type(&mut self) -> Option<usize> {
        if self.recursion_level > RECURSION_LIMIT {
            return None;
        }
        self.recursion_level += 1;
        let mut ret = None;
        if self.check(b'F') {
            if self.peek() == b'Y' {
                // extern "C": not shown.
                self.advance(1);
            }
            ret = self.bare_function_type(true);
            ret = self.ref_qualifier(ret);
            if !self.check(b'E') {
                ret = None;
            }
        }
        self.recursion_level -= 1;
        ret
    }

    fn parmlist(&mut self) -> Option<usize> {
        let mut head = None;
        let mut tail: Option<usize> = None;
        loop {
            let peek = self.peek();
            if peek == 0 || peek == b'E' || peek == b'.' {
                break;
            }
            if (peek == b'R' || peek == b'O') && self.peek_next() == b'E' {
                // A function's ref-qualifier, not a parameter.
                break;
            }
            let ty = self.type_()?;
            let node = self.comp(K::Arglist, Some(ty), None)?;
            match tail {
                None => head = Some(node),
                Some(t) => self.nodes[t].r = Some(node),
            }
            tail = Some(node);
        }
        let head = head?;
        // A lone `void` means no parameters.
        if self.nodes[head].r.is_none() {
            if let Some(l) = self.nodes[head].l {
                if self.k(l) == K::BuiltinType && BUILTINS[self.nodes[l].aux as usize].1 == Pr::Void
                {
                    self.nodes[head].l = None;
                }
            }
        }
        Some(head)
    }

    fn bare_function_type(&mut self, mut has_return_type: bool) -> Option<usize> {
        if self.peek() == b'J' {
            self.advance(1);
            has_return_type = true;
        }
        let ret = if has_return_type {
            Some(self.type_()?)
        } else {
            None
        };
        let tl = self.parmlist()?;
        self.comp(K::FunctionType, ret, Some(tl))
    }

    fn array_type(&mut self) -> Option<usize> {
        if !self.check(b'A') {
            return None;
        }
        let peek = self.peek();
        let dim = if peek == b'_' {
            None
        } else if is_digit(peek) {
            let start = self.n;
            while is_digit(self.peek()) {
                self.advance(1);
            }
            Some(self.make_name_src(start, self.n - start)?)
        } else {
            Some(self.expression()?)
        };
        if !self.check(b'_') {
            return None;
        }
        let t = self.type_();
        self.comp(K::ArrayType, dim, t)
    }

    fn vector_type(&mut self) -> Option<usize> {
        let dim = if self.peek() == b'_' {
            self.advance(1);
            self.expression()
        } else {
            self.number_component()
        };
        dim?;
        if !self.check(b'_') {
            return None;
        }
        let t = self.type_();
        self.comp(K::VectorType, dim, t)
    }

    fn pointer_to_member_type(&mut self) -> Option<usize> {
        if !self.check(b'M') {
            return None;
        }
        let cl = self.type_()?;
        let mem = self.type_()?;
        self.comp(K::PtrmemType, Some(cl), Some(mem))
    }

    /// `<non-negative number> _`, or -1.
    fn compact_number(&mut self) -> i32 {
        let num = match self.peek() {
            b'_' => 0,
            b'n' => return -1,
            _ => self.number().wrapping_add(1),
        };
        if num < 0 || !self.check(b'_') {
            return -1;
        }
        num
    }

    fn template_param(&mut self) -> Option<usize> {
        if !self.check(b'T') {
            return None;
        }
        let p = self.compact_number();
        if p < 0 {
            return None;
        }
        self.make_num(K::TemplateParam, p as i64)
    }

    fn template_args(&mut self) -> Option<usize> {
        if self.peek() != b'I' && self.peek() != b'J' {
            return None;
        }
        self.advance(1);
        self.template_args_1()
    }

    fn template_args_1(&mut self) -> Option<usize> {
        // Template arguments must not become the name a later constructor
        // or destructor refers to.
        let hold = self.last_name;
        if self.peek() == b'E' {
            // An empty argument pack.
            self.advance(1);
            return self.comp(K::TemplateArglist, None, None);
        }
        let mut head = None;
        let mut tail: Option<usize> = None;
        loop {
            let a = self.template_arg()?;
            let node = self.comp(K::TemplateArglist, Some(a), None)?;
            match tail {
                None => head = Some(node),
                Some(t) => self.nodes[t].r = Some(node),
            }
            tail = Some(node);
            if self.peek() == b'E' {
                self.advance(1);
                break;
            }
        }
        self.last_name = hold;
        head
    }

    fn template_arg(&mut self) -> Option<usize> {
        match self.peek() {
            b'X' => {
                self.advance(1);
                let r = self.expression();
                if !self.check(b'E') {
                    return None;
                }
                r
            }
            b'L' => self.expr_primary(),
            b'I' | b'J' => self.template_args(),
            _ => self.type_(),
        }
    }

    fn exprlist(&mut self, terminator: u8) -> Option<usize> {
        if self.peek() == terminator {
            self.advance(1);
            return self.comp(K::Arglist, None, None);
        }
        let mut head = None;
        let mut tail: Option<usize> = None;
        loop {
            let arg = self.expression()?;
            let node = self.comp(K::Arglist, Some(arg), None)?;
            match tail {
                None => head = Some(node),
                Some(t) => self.nodes[t].r = Some(node),
            }
            tail = Some(node);
            if self.peek() == terminator {
                self.advance(1);
                break;
            }
        }
        head
    }

    fn op_code(&self, op: usize) -> &'static str {
        OPS[self.nodes[op].aux as usize].0
    }

    fn unresolved_name(&mut self) -> Option<usize> {
        self.advance(2);
        let peek = self.peek();
        let ty;
        if self.unresolved_name_state != 0
            && (is_digit(peek) || is_lower(peek) || peek == b'C' || peek == b'U' || peek == b'L')
        {
            // `sr1AE1x` (new) and `sr1A1x` (old) both mean A::x: try the new
            // reading first; `demangle` retries the old one on failure.
            self.unresolved_name_state = -1;
            ty = self.prefix(false);
            if self.peek() == b'E' {
                self.advance(1);
            }
        } else {
            ty = self.type_();
        }
        let mut name = self.unqualified_name(ty, None);
        if self.peek() == b'I' {
            let a = self.template_args();
            name = self.comp(K::Template, name, a);
        }
        name
    }

    fn expression(&mut self) -> Option<usize> {
        let was = self.is_expression;
        self.is_expression = true;
        let r = self.expression_1();
        self.is_expression = was;
        r
    }

    fn expression_1(&mut self) -> Option<usize> {
        let peek = self.peek();
        let next = self.peek_next();
        if peek == b'L' {
            return self.expr_primary();
        }
        if peek == b'T' {
            return self.template_param();
        }
        if peek == b's' && next == b'r' {
            return self.unresolved_name();
        }
        if peek == b's' && next == b'p' {
            self.advance(2);
            let e = self.expression_1();
            return self.comp(K::PackExpansion, e, None);
        }
        if peek == b'f' && next == b'p' {
            self.advance(2);
            let index = if self.peek() == b'T' {
                // `this`
                self.advance(1);
                0
            } else {
                let i = self.compact_number();
                if i == i32::MAX || i == -1 {
                    return None;
                }
                i + 1
            };
            return self.make_num(K::FunctionParam, index as i64);
        }
        if is_digit(peek) || (peek == b'o' && next == b'n') {
            // An unqualified name in a dependent call, e.g. decltype(f(t)).
            if peek == b'o' {
                self.advance(2);
            }
            let name = self.unqualified_name(None, None)?;
            if self.peek() == b'I' {
                let a = self.template_args();
                return self.comp(K::Template, Some(name), a);
            }
            return Some(name);
        }
        if (peek == b'i' || peek == b't') && next == b'l' {
            // Braced initializer list, untyped or typed.
            self.advance(2);
            let ty = if peek == b't' { self.type_() } else { None };
            if self.peek() == 0 || self.peek_next() == 0 {
                return None;
            }
            let list = self.exprlist(b'E');
            return self.comp(K::InitializerList, ty, list);
        }
        if peek == b'u' {
            // Vendor extended expression.
            self.advance(1);
            let name = self.source_name();
            let args = self.template_args_1();
            return self.comp(K::VendorExpr, name, args);
        }

        let op = self.operator_name()?;
        let mut code: Option<&'static str> = None;
        if self.k(op) == K::Operator {
            let c = self.op_code(op);
            code = Some(c);
            if c == "st" {
                let t = self.type_();
                return self.comp(K::Unary, Some(op), t);
            }
        }
        let args = match self.k(op) {
            K::Operator => OPS[self.nodes[op].aux as usize].2,
            K::ExtendedOperator => self.nodes[op].num,
            K::Cast => 1,
            _ => return None,
        };
        match args {
            0 => self.comp(K::Nullary, Some(op), None),
            1 => {
                let mut suffix = false;
                if let Some(c) = code {
                    let c = c.as_bytes();
                    if (c[0] == b'p' || c[0] == b'm') && c[1] == c[0] {
                        // `pp_` / `mm_` are the prefix forms.
                        suffix = !self.check(b'_');
                    }
                }
                let operand = if self.k(op) == K::Cast && self.check(b'_') {
                    self.exprlist(b'E')
                } else if code == Some("sP") {
                    self.template_args_1()
                } else {
                    self.expression_1()
                };
                let operand = if suffix {
                    // Marks the postfix form for the printer.
                    self.comp(K::BinaryArgs, operand, operand)
                } else {
                    operand
                };
                self.comp(K::Unary, Some(op), operand)
            }
            2 => {
                let c = code?;
                let left = if is_new_cast(c) {
                    self.type_()
                } else if c.as_bytes()[0] == b'f' {
                    // Fold expression.
                    self.operator_name()
                } else if c == "di" {
                    self.unqualified_name(None, None)
                } else {
                    self.expression_1()
                };
                let right = if c == "cl" {
                    self.exprlist(b'E')
                } else if c == "dt" || c == "pt" {
                    let p = self.peek();
                    let q = self.peek_next();
                    if (p == b'g' && q == b's') || (p == b's' && q == b'r') {
                        self.expression_1()
                    } else {
                        // Old manglings omit `on` before operator names.
                        let mut r = self.unqualified_name(None, None);
                        if self.peek() == b'I' {
                            let a = self.template_args();
                            r = self.comp(K::Template, r, a);
                        }
                        r
                    }
                } else {
                    self.expression_1()
                };
                let ba = self.comp(K::BinaryArgs, left, right);
                self.comp(K::Binary, Some(op), ba)
            }
            3 => {
                let c = code?;
                let cb = c.as_bytes();
                let (first, second, third);
                if c == "qu" || c == "dX" {
                    first = self.expression_1();
                    second = self.expression_1();
                    third = self.expression_1();
                    third?;
                } else if cb[0] == b'f' {
                    first = self.operator_name();
                    second = self.expression_1();
                    third = self.expression_1();
                    third?;
                } else if cb[0] == b'n' {
                    if cb[1] != b'w' && cb[1] != b'a' {
                        return None;
                    }
                    first = self.exprlist(b'_');
                    second = self.type_();
                    if self.peek() == b'E' {
                        self.advance(1);
                        third = None;
                    } else if self.peek() == b'p' && self.peek_next() == b'i' {
                        // Parenthesized initializer.
                        self.advance(2);
                        third = self.exprlist(b'E');
                    } else if self.peek() == b'i' && self.peek_next() == b'l' {
                        third = self.expression_1();
                    } else {
                        return None;
                    }
                } else {
                    return None;
                }
                let a2 = self.comp(K::TrinaryArg2, second, third);
                let a1 = self.comp(K::TrinaryArg1, first, a2);
                self.comp(K::Trinary, Some(op), a1)
            }
            _ => None,
        }
    }

    fn expr_primary(&mut self) -> Option<usize> {
        if !self.check(b'L') {
            return None;
        }
        let ret;
        if self.peek() == b'_' || self.peek() == b'Z' {
            // `Z` without `_`: an old g++ bug.
            ret = self.mangled_name(false);
        } else {
            let ty = self.type_()?;
            if self.k(ty) == K::BuiltinType
                && self.nodes[ty].aux == BT_NULLPTR
                && self.peek() == b'E'
            {
                self.advance(1);
                return Some(ty);
            }
            let mut k = K::Literal;
            if self.peek() == b'n' {
                k = K::LiteralNeg;
                self.advance(1);
            }
            // The value is kept as text, uninterpreted.
            let start = self.n;
            while self.peek() != b'E' {
                if self.peek() == 0 {
                    return None;
                }
                self.advance(1);
            }
            let v = self.make_name_src(start, self.n - start);
            ret = self.comp(k, Some(ty), v);
        }
        if !self.check(b'E') {
            return None;
        }
        ret
    }

    fn local_name(&mut self) -> Option<usize> {
        if !self.check(b'Z') {
            return None;
        }
        let function = self.encoding(false)?;
        if !self.check(b'E') {
            return None;
        }
        let name;
        if self.peek() == b's' {
            self.advance(1);
            if !self.discriminator() {
                return None;
            }
            name = self.make_name_lit("string literal");
        } else {
            let mut num = -1;
            if self.peek() == b'd' {
                // Default argument scope.
                self.advance(1);
                num = self.compact_number();
                if num < 0 {
                    return None;
                }
            }
            let mut nm = self.name(false);
            if let Some(x) = nm {
                // Lambdas and unnamed types carry their own discriminator.
                if self.k(x) != K::Lambda && self.k(x) != K::UnnamedType && !self.discriminator() {
                    return None;
                }
            }
            if num >= 0 {
                nm = self.make_with_sub(K::DefaultArg, num as i64, nm);
            }
            name = nm;
        }
        // The enclosing function is shown without its return type.
        if self.k(function) == K::TypedName {
            if let Some(r) = self.nodes[function].r {
                if self.k(r) == K::FunctionType {
                    self.nodes[r].l = None;
                }
            }
        }
        self.comp(K::LocalName, Some(function), name)
    }

    /// `_ <digit>` or `__ <number> _`; read and not shown.
    fn discriminator(&mut self) -> bool {
        if self.peek() != b'_' {
            return true;
        }
        self.advance(1);
        let mut underscores = 1;
        if self.peek() == b'_' {
            underscores += 1;
            self.advance(1);
        }
        let d = self.number();
        if d < 0 {
            return false;
        }
        if underscores > 1 && d >= 10 {
            if self.peek() == b'_' {
                self.advance(1);
            } else {
                return false;
            }
        }
        true
    }

    fn template_parm(&mut self, bad: &mut bool) -> Option<usize> {
        if self.peek() != b'T' {
            return None;
        }
        let (op, k);
        match self.peek_next() {
            b'p' => {
                self.advance(2);
                op = self.template_parm(bad);
                k = K::TemplatePackParm;
                if op.is_none() {
                    *bad = true;
                    return None;
                }
            }
            b'y' => {
                self.advance(2);
                op = None;
                k = K::TemplateTypeParm;
            }
            b'n' => {
                self.advance(2);
                op = self.type_();
                k = K::TemplateNonTypeParm;
                if op.is_none() {
                    *bad = true;
                    return None;
                }
            }
            b't' => {
                self.advance(2);
                op = self.template_head(bad);
                k = K::TemplateTemplateParm;
                if op.is_none() || !self.check(b'E') {
                    *bad = true;
                    return None;
                }
            }
            _ => return None,
        }
        self.comp(k, op, None)
    }

    fn template_head(&mut self, bad: &mut bool) -> Option<usize> {
        let mut res = None;
        let mut last: Option<usize> = None;
        while let Some(op) = self.template_parm(bad) {
            match last {
                None => res = Some(op),
                Some(l) => self.nodes[l].r = Some(op),
            }
            last = Some(op);
        }
        if res.is_some() {
            res = self.comp(K::TemplateHead, res, None);
        }
        res
    }

    fn lambda(&mut self) -> Option<usize> {
        if !self.check(b'U') || !self.check(b'l') {
            return None;
        }
        let mut bad = false;
        let head = self.template_head(&mut bad);
        if bad {
            return None;
        }
        let mut tl = self.parmlist()?;
        if let Some(h) = head {
            self.nodes[h].r = Some(tl);
            tl = h;
        }
        if !self.check(b'E') {
            return None;
        }
        let num = self.compact_number();
        if num < 0 {
            return None;
        }
        self.make_with_sub(K::Lambda, num as i64, Some(tl))
    }

    fn unnamed_type(&mut self) -> Option<usize> {
        if !self.check(b'U') || !self.check(b't') {
            return None;
        }
        let num = self.compact_number();
        if num < 0 {
            return None;
        }
        let ret = self.make_num(K::UnnamedType, num as i64);
        if !self.add_subst(ret) {
            return None;
        }
        ret
    }

    fn clone_suffix(&mut self, encoding: Option<usize>) -> Option<usize> {
        let start = self.n;
        let mut p = start;
        let word = |c: u8| is_lower(c) || is_digit(c) || c == b'_';
        if self.at(p) == b'.' && word(self.at(p + 1)) {
            p += 2;
            while word(self.at(p)) {
                p += 1;
            }
        }
        while self.at(p) == b'.' && is_digit(self.at(p + 1)) {
            p += 2;
            while is_digit(self.at(p)) {
                p += 1;
            }
        }
        self.advance(p - start);
        let n = self.make_name_src(start, p - start);
        self.comp(K::Clone, encoding, n)
    }

    fn substitution(&mut self, prefix: bool) -> Option<usize> {
        if !self.check(b'S') {
            return None;
        }
        let mut c = self.next_char();
        if c == b'_' || is_digit(c) || is_upper(c) {
            let mut id: u32 = 0;
            if c != b'_' {
                loop {
                    let digit = if is_digit(c) {
                        (c - b'0') as u32
                    } else if is_upper(c) {
                        (c - b'A') as u32 + 10
                    } else {
                        return None;
                    };
                    let new_id = id.wrapping_mul(36).wrapping_add(digit);
                    if new_id < id {
                        return None;
                    }
                    id = new_id;
                    c = self.next_char();
                    if c == b'_' {
                        break;
                    }
                }
                id = id.wrapping_add(1);
            }
            return self.subs.get(id as usize).copied();
        }
        // Before a constructor or destructor the full form is used, so that
        // `Sd C1` reads `std::basic_iostream<...>::basic_iostream`.
        let verbose = prefix && matches!(self.peek(), b'C' | b'D');
        let &(_, simple, full, last) = STD_SUBS.iter().find(|s| s.0 == c)?;
        if let Some(l) = last {
            self.last_name = self.make_sub(l);
        }
        let mut dc = self.make_sub(if verbose { full } else { simple });
        if self.peek() == b'B' {
            // With ABI tags the abbreviation becomes a substitution candidate.
            dc = self.abi_tags(dc);
            if !self.add_subst(dc) {
                return None;
            }
        }
        dc
    }
}

fn is_new_cast(code: &str) -> bool {
    let c = code.as_bytes();
    c[1] == b'c' && matches!(c[0], b's' | b'd' | b'c' | b'r')
}

// ---------------------------------------------------------------------------
// Printer

/// A pending type modifier (`struct d_print_mod`): printed by whichever
/// component reaches the right place first.
#[derive(Debug, Clone, Copy)]
struct Mod {
    next: Option<usize>,
    m: usize,
    printed: bool,
    templates: Option<usize>,
}

/// A template whose arguments template parameters refer to, in a
/// persistent list (`struct d_print_template`).
#[derive(Debug, Clone, Copy)]
struct Tpl {
    decl: Option<usize>,
    next: Option<usize>,
}

struct Printer<'a> {
    nodes: &'a [Node],
    src: &'a [u8],
    out: Vec<u8>,
    last_char: u8,
    /// Fill of libiberty's 256-byte output buffer and its flush count: an
    /// empty pack's ", " is taken back only if the buffer was not flushed
    /// in between, which shows in the output.
    buf_len: usize,
    flush_count: u64,
    templates: Option<usize>,
    tpls: Vec<Tpl>,
    modifiers: Option<usize>,
    mods: Vec<Mod>,
    failed: bool,
    recursion: usize,
    lambda_tpl_parms: i64,
    pack_index: i64,
    stack: Vec<usize>,
    saved_scopes: Vec<(usize, Option<usize>)>,
    num_saved_scopes: i64,
    next_copy_template: i64,
    num_copy_templates: i64,
    current_template: Option<usize>,
    printing: Vec<u8>,
    counting: Vec<u8>,
    steps: u64,
}

impl<'a> Printer<'a> {
    fn new(nodes: &'a [Node], src: &'a [u8]) -> Self {
        Printer {
            nodes,
            src,
            out: Vec::new(),
            last_char: 0,
            buf_len: 0,
            flush_count: 0,
            templates: None,
            tpls: Vec::new(),
            modifiers: None,
            mods: Vec::new(),
            failed: false,
            recursion: 0,
            lambda_tpl_parms: 0,
            pack_index: 0,
            stack: Vec::new(),
            saved_scopes: Vec::new(),
            num_saved_scopes: 0,
            next_copy_template: 0,
            num_copy_templates: 0,
            current_template: None,
            printing: vec![0; nodes.len()],
            counting: vec![0; nodes.len()],
            steps: 0,
        }
    }

    fn print(mut self, root: usize) -> Option<Vec<u8>> {
        // libiberty sizes its scope tables from a first walk; a print that
        // needs more fails, so the walk is reproduced.
        self.count_templates_scopes(Some(root));
        self.recursion = 0;
        self.num_copy_templates *= self.num_saved_scopes;
        self.print_comp(Some(root));
        if self.failed {
            None
        } else {
            Some(self.out)
        }
    }

    fn k(&self, i: usize) -> K {
        self.nodes[i].k
    }
    fn kind(&self, i: Option<usize>) -> Option<K> {
        i.map(|i| self.nodes[i].k)
    }
    fn l(&self, i: usize) -> Option<usize> {
        self.nodes[i].l
    }
    fn r(&self, i: usize) -> Option<usize> {
        self.nodes[i].r
    }
    fn op_code(&self, op: usize) -> &'static str {
        OPS[self.nodes[op].aux as usize].0
    }
    fn op_name(&self, op: usize) -> &'static str {
        OPS[self.nodes[op].aux as usize].1
    }

    fn fail(&mut self) {
        self.failed = true;
    }

    fn flush(&mut self) {
        self.flush_count += 1;
        self.buf_len = 0;
    }

    fn ch(&mut self, c: u8) {
        if self.buf_len == 255 {
            self.flush();
        }
        if self.out.len() >= MAX_OUTPUT {
            self.failed = true;
            return;
        }
        self.out.push(c);
        self.buf_len += 1;
        self.last_char = c;
    }

    fn s(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }

    fn bytes(&mut self, s: &[u8]) {
        for &c in s {
            self.ch(c);
        }
    }

    fn num(&mut self, n: i64) {
        // libiberty prints through an `int`.
        self.s(&(n as i32).to_string());
    }

    fn text(&mut self, t: Text) {
        match t {
            Text::None => {}
            Text::Src(start, len) => {
                let (start, len) = (start as usize, len as usize);
                let src = self.src;
                self.bytes(&src[start..start + len]);
            }
            Text::Lit(s) => self.s(s),
        }
    }

    fn text_len(&self, t: Text) -> usize {
        match t {
            Text::None => 0,
            Text::Src(_, len) => len as usize,
            Text::Lit(s) => s.len(),
        }
    }

    fn text_first(&self, t: Text) -> u8 {
        match t {
            Text::None => 0,
            Text::Src(start, _) => self.src[start as usize],
            Text::Lit(s) => s.as_bytes().first().copied().unwrap_or(0),
        }
    }

    /// The modifier at `i`, if it still exists (after an error a stale
    /// index may be left behind; the output is discarded then anyway).
    fn md(&mut self, i: usize) -> Option<Mod> {
        let m = self.mods.get(i).copied();
        if m.is_none() {
            self.fail();
        }
        m
    }

    fn set_printed(&mut self, i: usize) {
        if let Some(m) = self.mods.get_mut(i) {
            m.printed = true;
        }
    }

    fn push_mod(&mut self, m: usize) -> usize {
        self.mods.push(Mod {
            next: self.modifiers,
            m,
            printed: false,
            templates: self.templates,
        });
        self.mods.len() - 1
    }

    fn push_tpl(&mut self, decl: Option<usize>) -> usize {
        self.tpls.push(Tpl {
            decl,
            next: self.templates,
        });
        self.tpls.len() - 1
    }

    fn count_templates_scopes(&mut self, dc: Option<usize>) {
        use K::*;
        let Some(d) = dc else { return };
        if self.counting[d] > 1 || self.recursion > MAX_PRINT_RECURSION {
            return;
        }
        self.counting[d] += 1;
        match self.k(d) {
            Name | TemplateParam | FunctionParam | SubStd | BuiltinType | ExtendedBuiltinType
            | Operator | Character | Number | UnnamedType | StructuredBinding | ModuleName
            | ModulePartition | ModuleInit | TemplateHead | TemplateTypeParm
            | TemplateNonTypeParm | TemplateTemplateParm | TemplatePackParm => {}
            Ctor | Dtor | ExtendedOperator | ModuleEntity | Lambda | DefaultArg => {
                self.count_templates_scopes(self.l(d))
            }
            k => {
                if k == Template {
                    self.num_copy_templates += 1;
                }
                if matches!(k, Reference | RvalueReference)
                    && self.kind(self.l(d)) == Some(TemplateParam)
                {
                    self.num_saved_scopes += 1;
                }
                if self.recursion > RECURSION_LIMIT {
                    return;
                }
                self.recursion += 1;
                self.count_templates_scopes(self.l(d));
                self.count_templates_scopes(self.r(d));
                self.recursion -= 1;
            }
        }
    }

    fn print_comp(&mut self, dc: Option<usize>) {
        let Some(d) = dc else {
            self.fail();
            return;
        };
        // A component may be on the stack at most twice: substitutions can
        // make the graph print itself forever otherwise.
        if self.printing[d] > 1 || self.recursion > MAX_PRINT_RECURSION {
            self.fail();
            return;
        }
        self.steps += 1;
        if self.steps > MAX_STEPS {
            self.fail();
            return;
        }
        self.printing[d] += 1;
        self.recursion += 1;
        self.stack.push(d);
        let base = self.mods.len();
        self.print_inner(d);
        // Modifiers live as long as the component that pushed them.
        self.mods.truncate(base);
        self.stack.pop();
        self.printing[d] -= 1;
        self.recursion -= 1;
    }

    fn index_template_argument(&self, args: Option<usize>, i: i64) -> Option<usize> {
        if i < 0 {
            // The whole pack.
            return args;
        }
        let mut a = args;
        let mut i = i;
        while let Some(x) = a {
            if self.k(x) != K::TemplateArglist {
                return None;
            }
            if i <= 0 {
                break;
            }
            i -= 1;
            a = self.r(x);
        }
        if i != 0 {
            return None;
        }
        self.l(a?)
    }

    fn lookup_template_argument(&mut self, dc: usize) -> Option<usize> {
        let Some(t) = self.templates else {
            self.fail();
            return None;
        };
        let Some(decl) = self.tpls[t].decl else {
            // libiberty would dereference NULL here.
            self.fail();
            return None;
        };
        self.index_template_argument(self.r(decl), self.nodes[dc].num)
    }

    fn find_pack(&mut self, dc: Option<usize>) -> Option<usize> {
        use K::*;
        let d = dc?;
        self.steps += 1;
        if self.steps > MAX_STEPS {
            self.fail();
            return None;
        }
        match self.k(d) {
            TemplateParam => {
                let a = self.lookup_template_argument(d)?;
                (self.k(a) == TemplateArglist).then_some(a)
            }
            PackExpansion | Lambda | Name | TaggedName | Operator | BuiltinType
            | ExtendedBuiltinType | SubStd | Character | FunctionParam | UnnamedType
            | DefaultArg | Number => None,
            ExtendedOperator | Ctor | Dtor => self.find_pack(self.l(d)),
            _ => {
                if let Some(a) = self.find_pack(self.l(d)) {
                    return Some(a);
                }
                self.find_pack(self.r(d))
            }
        }
    }

    fn pack_length(&self, mut dc: Option<usize>) -> i64 {
        let mut count = 0;
        while let Some(d) = dc {
            if self.k(d) != K::TemplateArglist || self.l(d).is_none() {
                break;
            }
            count += 1;
            dc = self.r(d);
        }
        count
    }

    fn args_length(&mut self, mut dc: Option<usize>) -> i64 {
        let mut count = 0;
        while let Some(d) = dc {
            if self.k(d) != K::TemplateArglist {
                break;
            }
            let Some(elt) = self.l(d) else { break };
            if self.k(elt) == K::PackExpansion {
                let a = self.find_pack(self.l(elt));
                count += self.pack_length(a);
            } else {
                count += 1;
            }
            dc = self.r(d);
        }
        count
    }

    /// An operand of an expression, parenthesized unless simple.
    fn print_subexpr(&mut self, dc: Option<usize>) {
        let Some(d) = dc else {
            self.fail();
            return;
        };
        let simple = matches!(
            self.k(d),
            K::Name | K::QualName | K::InitializerList | K::FunctionParam
        );
        if !simple {
            self.ch(b'(');
        }
        self.print_comp(dc);
        if !simple {
            self.ch(b')');
        }
    }

    fn save_scope(&mut self, container: usize) {
        if self.saved_scopes.len() as i64 >= self.num_saved_scopes {
            self.fail();
            return;
        }
        self.saved_scopes.push((container, self.templates));
        let mut src = self.templates;
        while let Some(s) = src {
            if self.next_copy_template >= self.num_copy_templates {
                self.fail();
                return;
            }
            self.next_copy_template += 1;
            src = self.tpls[s].next;
        }
    }

    fn maybe_print_fold(&mut self, d: usize) -> bool {
        let Some(op) = self.l(d) else { return false };
        let code = self.op_code(op).as_bytes();
        if code[0] != b'f' {
            return false;
        }
        let Some(ops) = self.r(d) else { return false };
        let operator = self.l(ops);
        let mut op1 = self.r(ops);
        let mut op2 = None;
        if let Some(o) = op1 {
            if self.k(o) == K::TrinaryArg2 {
                op2 = self.r(o);
                op1 = self.l(o);
            }
        }
        // The whole pack.
        let save = self.pack_index;
        self.pack_index = -1;
        match code[1] {
            b'l' => {
                self.s("(...");
                self.print_expr_op(operator);
                self.print_subexpr(op1);
                self.ch(b')');
            }
            b'r' => {
                self.ch(b'(');
                self.print_subexpr(op1);
                self.print_expr_op(operator);
                self.s("...)");
            }
            b'L' | b'R' => {
                self.ch(b'(');
                self.print_subexpr(op1);
                self.print_expr_op(operator);
                self.s("...");
                self.print_expr_op(operator);
                self.print_subexpr(op2);
                self.ch(b')');
            }
            _ => {}
        }
        self.pack_index = save;
        true
    }

    fn is_designated_init(&self, dc: Option<usize>) -> bool {
        let Some(d) = dc else { return false };
        if !matches!(self.k(d), K::Binary | K::Trinary) {
            return false;
        }
        let Some(op) = self.l(d) else { return false };
        let c = self.op_code(op).as_bytes();
        c[0] == b'd' && matches!(c[1], b'i' | b'x' | b'X')
    }

    fn maybe_print_designated_init(&mut self, d: usize) -> bool {
        if !self.is_designated_init(Some(d)) {
            return false;
        }
        let code = self.op_code(self.l(d).unwrap_or(0)).as_bytes();
        let Some(operands) = self.r(d) else {
            self.fail();
            return true;
        };
        let op1 = self.l(operands);
        let mut op2 = self.r(operands);
        self.ch(if code[1] == b'i' { b'.' } else { b'[' });
        self.print_comp(op1);
        if code[1] == b'X' {
            self.s(" ... ");
            let Some(o) = op2 else {
                self.fail();
                return true;
            };
            self.print_comp(self.l(o));
            op2 = self.r(o);
        }
        if code[1] != b'i' {
            self.ch(b']');
        }
        if self.is_designated_init(op2) {
            // Chained designators take no '=' between them.
            self.print_comp(op2);
        } else {
            self.ch(b'=');
            self.print_subexpr(op2);
        }
        true
    }

    fn print_lambda_parm_name(&mut self, k: K, index: i64) {
        let s = match k {
            K::TemplateTypeParm => "$T",
            K::TemplateNonTypeParm => "$N",
            K::TemplateTemplateParm => "$TT",
            _ => {
                self.fail();
                ""
            }
        };
        self.s(s);
        self.num(index);
    }

    fn print_inner(&mut self, d: usize) {
        use K::*;
        if self.failed {
            return;
        }
        let node = self.nodes[d];
        match node.k {
            Name => self.text(node.text),
            TaggedName => self.print_tagged_name(d),
            StructuredBinding => self.print_structured_binding(d),
            ModuleEntity => self.print_module_entity(d),
            ModuleName | ModulePartition => self.print_module_name(d),
            QualName | LocalName => self.print_qual_name(d),
            TypedName => self.print_typed_name(d),
            Template => self.print_template(d),
            TemplateParam => self.print_template_param(d),
            TparmObj => self.print_tparm_obj(d),
            Ctor => self.print_comp(node.l),
            Dtor => self.print_dtor(d),
            ModuleInit => self.print_module_init(d),
            ConstructionVtable => self.print_construction_vtable(d),
            Reftemp => self.print_reftemp(d),
            Vtable | Vtt | Typeinfo | TypeinfoName | TypeinfoFn | Thunk | VirtualThunk
            | CovariantThunk | JavaClass | Guard | TlsInit | TlsWrapper | HiddenAlias
            | TransactionClone | NontransactionClone | JavaResource => self.print_special_name(d),
            SubStd => self.text(node.text),
            Restrict | Volatile | Const => self.print_cv_qualifier(d),
            Reference | RvalueReference => self.print_reference(d),
            VendorTypeQual | Pointer | Complex | Imaginary | RestrictThis | VolatileThis
            | ConstThis | ReferenceThis | RvalueReferenceThis | TransactionSafe | Noexcept
            | ThrowSpec => self.print_modifier(d, None, None),
            BuiltinType => self.s(BUILTINS[node.aux as usize].0),
            ExtendedBuiltinType => self.print_extended_builtin_type(d),
            VendorType => self.print_comp(node.l),
            FunctionType => self.print_function(d),
            ArrayType => self.print_array(d),
            PtrmemType | VectorType => self.print_ptrmem_type(d),
            Arglist | TemplateArglist => self.print_arglist(d),
            InitializerList => self.print_initializer_list(d),
            Operator => self.print_operator(d),
            ExtendedOperator => self.print_extended_operator(d),
            Conversion => self.print_conversion_operator(d),
            Nullary => self.print_expr_op(node.l),
            Unary => self.print_unary(d),
            Binary => self.print_binary(d),
            Trinary => self.print_trinary(d),
            Literal | LiteralNeg => self.print_literal(d),
            VendorExpr => self.print_vendor_expr(d),
            Number => self.num(node.num),
            CompoundName => self.print_compound_name(d),
            Character => self.ch(node.aux),
            Decltype => self.print_decltype(d),
            PackExpansion => self.print_pack_expansion(d),
            FunctionParam => self.print_function_param(d),
            Lambda => self.print_lambda(d),
            UnnamedType => self.print_unnamed_type(d),
            Clone => self.print_clone(d),
            TemplateHead => self.print_template_head(d),
            TemplateTypeParm => self.s("typename"),
            TemplateNonTypeParm => self.print_comp(node.l),
            TemplateTemplateParm => self.print_template_template_parm(d),
            TemplatePackParm => self.print_template_pack_parm(d),
            BinaryArgs | TrinaryArg1 | TrinaryArg2 | DefaultArg | Cast => self.fail(),
        }
    }

    fn print_tagged_name(&mut self, d: usize) {
        let node = self.nodes[d];
        self.print_comp(node.l);
        self.s("[abi:");
        self.print_comp(node.r);
        self.ch(b']');
    }

    fn print_structured_binding(&mut self, d: usize) {
        self.ch(b'[');
        let mut cur = d;
        loop {
            self.print_comp(self.l(cur));
            match self.r(cur) {
                Some(n) => cur = n,
                None => break,
            }
            self.s(", ");
        }
        self.ch(b']');
    }

    fn print_module_entity(&mut self, d: usize) {
        let node = self.nodes[d];
        self.print_comp(node.l);
        self.ch(b'@');
        self.print_comp(node.r);
    }

    fn print_module_name(&mut self, d: usize) {
        use K::*;
        let node = self.nodes[d];
        if node.l.is_some() {
            self.print_comp(node.l);
        }
        if node.k == ModulePartition {
            self.ch(b':');
        } else if node.l.is_some() {
            self.ch(b'.');
        }
        self.print_comp(node.r);
    }

    fn print_qual_name(&mut self, d: usize) {
        use K::*;
        let node = self.nodes[d];
        self.print_comp(node.l);
        self.s("::");
        let Some(mut local) = node.r else {
            self.fail();
            return;
        };
        if self.k(local) == DefaultArg {
            self.s("{default arg#");
            self.num(self.nodes[local].num + 1);
            self.s("}::");
            match self.l(local) {
                Some(x) => local = x,
                None => {
                    self.fail();
                    return;
                }
            }
        }
        self.print_comp(Some(local));
    }

    fn print_template(&mut self, d: usize) {
        let node = self.nodes[d];
        // A cast operator below may refer to this template.
        let hold_current = self.current_template;
        self.current_template = Some(d);
        // Modifiers are not pushed into a template's arguments.
        let hold_mods = self.modifiers;
        self.modifiers = None;
        self.print_comp(node.l);
        if self.last_char == b'<' {
            self.ch(b' ');
        }
        self.ch(b'<');
        self.print_comp(node.r);
        // Avoid `>>`, C++03's shift-operator ambiguity.
        if self.last_char == b'>' {
            self.ch(b' ');
        }
        self.ch(b'>');
        self.modifiers = hold_mods;
        self.current_template = hold_current;
    }

    fn print_tparm_obj(&mut self, d: usize) {
        let node = self.nodes[d];
        self.s("template parameter object for ");
        self.print_comp(node.l);
    }

    fn print_dtor(&mut self, d: usize) {
        let node = self.nodes[d];
        self.ch(b'~');
        self.print_comp(node.l);
    }

    fn print_module_init(&mut self, d: usize) {
        let node = self.nodes[d];
        self.s("initializer for module ");
        self.print_comp(node.l);
    }

    fn print_construction_vtable(&mut self, d: usize) {
        let node = self.nodes[d];
        self.s("construction vtable for ");
        self.print_comp(node.l);
        self.s("-in-");
        self.print_comp(node.r);
    }

    fn print_reftemp(&mut self, d: usize) {
        let node = self.nodes[d];
        self.s("reference temporary #");
        self.print_comp(node.r);
        self.s(" for ");
        self.print_comp(node.l);
    }

    fn print_special_name(&mut self, d: usize) {
        use K::*;
        let node = self.nodes[d];
        self.s(match node.k {
            Vtable => "vtable for ",
            Vtt => "VTT for ",
            Typeinfo => "typeinfo for ",
            TypeinfoName => "typeinfo name for ",
            TypeinfoFn => "typeinfo fn for ",
            Thunk => "non-virtual thunk to ",
            VirtualThunk => "virtual thunk to ",
            CovariantThunk => "covariant return thunk to ",
            JavaClass => "java Class for ",
            Guard => "guard variable for ",
            TlsInit => "TLS init function for ",
            TlsWrapper => "TLS wrapper function for ",
            HiddenAlias => "hidden alias for ",
            TransactionClone => "transaction clone for ",
            NontransactionClone => "non-transaction clone for ",
            _ => "java resource ",
        });
        self.print_comp(node.l);
    }

    fn print_cv_qualifier(&mut self, d: usize) {
        use K::*;
        let node = self.nodes[d];
        // Array printing can push the same qualifier twice; print it once.
        let mut p = self.modifiers;
        while let Some(pi) = p {
            let Some(pm) = self.md(pi) else { return };
            if !pm.printed {
                let mk = self.k(pm.m);
                if mk != Restrict && mk != Volatile && mk != Const {
                    break;
                }
                if mk == node.k {
                    self.print_comp(node.l);
                    return;
                }
            }
            p = pm.next;
        }
        self.print_modifier(d, None, None);
    }

    fn print_extended_builtin_type(&mut self, d: usize) {
        let node = self.nodes[d];
        self.s(BUILTINS[node.aux2 as usize].0);
        self.num(node.num);
        if node.aux != 0 {
            self.ch(node.aux);
        }
    }

    fn print_function(&mut self, d: usize) {
        let node = self.nodes[d];
        if node.l.is_some() {
            // The return type goes first; the function type rides down as
            // a modifier so that a pointer to function prints as
            // `int (*)(char)`.
            let mi = self.push_mod(d);
            self.modifiers = Some(mi);
            self.print_comp(node.l);
            let Some(m) = self.md(mi) else { return };
            self.modifiers = m.next;
            if m.printed {
                return;
            }
            self.ch(b' ');
        }
        self.print_function_type(d, self.modifiers);
    }

    fn print_ptrmem_type(&mut self, d: usize) {
        let node = self.nodes[d];
        let mi = self.push_mod(d);
        self.modifiers = Some(mi);
        self.print_comp(node.r);
        let Some(m) = self.md(mi) else { return };
        if !m.printed {
            self.print_mod(d);
        }
        self.modifiers = m.next;
    }

    fn print_arglist(&mut self, d: usize) {
        let node = self.nodes[d];
        if node.l.is_some() {
            self.print_comp(node.l);
        }
        if node.r.is_some() {
            if self.buf_len >= 254 {
                self.flush();
            }
            self.s(", ");
            let (len, flushes) = (self.buf_len, self.flush_count);
            self.print_comp(node.r);
            // Nothing printed (an empty pack): take the ", " back.
            // `last_char` stays ' ', a libiberty quirk that shows as
            // `A<B<int>>` without the usual space.
            if self.flush_count == flushes && self.buf_len == len {
                self.buf_len -= 2;
                let n = self.out.len();
                self.out.truncate(n.saturating_sub(2));
            }
        }
    }

    fn print_initializer_list(&mut self, d: usize) {
        let node = self.nodes[d];
        if node.l.is_some() {
            self.print_comp(node.l);
        }
        self.ch(b'{');
        self.print_comp(node.r);
        self.ch(b'}');
    }

    fn print_operator(&mut self, d: usize) {
        let name = self.op_name(d);
        self.s("operator");
        // A space before `new`, `delete`, `sizeof`...
        if is_lower(name.as_bytes()[0]) {
            self.ch(b' ');
        }
        self.s(name.strip_suffix(' ').unwrap_or(name));
    }

    fn print_extended_operator(&mut self, d: usize) {
        let node = self.nodes[d];
        self.s("operator ");
        self.print_comp(node.l);
    }

    fn print_conversion_operator(&mut self, d: usize) {
        self.s("operator ");
        self.print_conversion(d);
    }

    fn print_vendor_expr(&mut self, d: usize) {
        let node = self.nodes[d];
        self.print_comp(node.l);
        self.ch(b'(');
        self.print_comp(node.r);
        self.ch(b')');
    }

    fn print_compound_name(&mut self, d: usize) {
        let node = self.nodes[d];
        self.print_comp(node.l);
        self.print_comp(node.r);
    }

    fn print_decltype(&mut self, d: usize) {
        let node = self.nodes[d];
        self.s("decltype (");
        self.print_comp(node.l);
        self.ch(b')');
    }

    fn print_pack_expansion(&mut self, d: usize) {
        let node = self.nodes[d];
        let a = if self.lambda_tpl_parms == 0 {
            self.find_pack(node.l)
        } else {
            None
        };
        match a {
            None => {
                // Only function parameter packs: print the pattern.
                self.print_subexpr(node.l);
                self.s("...");
            }
            Some(a) => {
                let len = self.pack_length(Some(a));
                for i in 0..len {
                    if i > 0 {
                        self.s(", ");
                    }
                    // Not restored afterwards, as in libiberty.
                    self.pack_index = i;
                    self.print_comp(node.l);
                }
            }
        }
    }

    fn print_function_param(&mut self, d: usize) {
        let node = self.nodes[d];
        if node.num == 0 {
            self.s("this");
        } else {
            self.s("{parm#");
            self.num(node.num);
            self.ch(b'}');
        }
    }

    fn print_unnamed_type(&mut self, d: usize) {
        let node = self.nodes[d];
        self.s("{unnamed type#");
        self.num(node.num + 1);
        self.ch(b'}');
    }

    fn print_clone(&mut self, d: usize) {
        let node = self.nodes[d];
        self.print_comp(node.l);
        self.s(" [clone ");
        self.print_comp(node.r);
        self.ch(b']');
    }

    fn print_template_head(&mut self, d: usize) {
        let node = self.nodes[d];
        self.ch(b'<');
        let mut parm = node.l;
        let mut first = true;
        while let Some(p) = parm {
            if !first {
                self.s(", ");
            }
            first = false;
            self.print_comp(Some(p));
            parm = self.r(p);
        }
        self.ch(b'>');
    }

    fn print_template_template_parm(&mut self, d: usize) {
        let node = self.nodes[d];
        self.s("template");
        self.print_comp(node.l);
        self.s(" class");
    }

    fn print_template_pack_parm(&mut self, d: usize) {
        let node = self.nodes[d];
        self.print_comp(node.l);
        self.s("...");
    }

    fn print_typed_name(&mut self, d: usize) {
        // The name is passed down to the type so that it lands in the right
        // place, with the qualifiers of `this` as modifiers.
        let node = self.nodes[d];
        let hold = self.modifiers;
        self.modifiers = None;
        let base = self.mods.len();
        let blank = Mod {
            next: None,
            m: 0,
            printed: false,
            templates: None,
        };
        self.mods.extend([blank; 4]);
        let mut i = 0usize;
        let mut typed = node.l;
        while let Some(x) = typed {
            if i >= 4 {
                self.fail();
                return;
            }
            self.mods[base + i] = Mod {
                next: self.modifiers,
                m: x,
                printed: false,
                templates: self.templates,
            };
            self.modifiers = Some(base + i);
            i += 1;
            if !is_fnqual(self.k(x)) {
                break;
            }
            typed = self.l(x);
        }
        let Some(mut typed) = typed else {
            self.fail();
            return;
        };
        if self.k(typed) == K::LocalName {
            // Qualifiers on a local class's member function really apply
            // here.
            let mut x = self.r(typed);
            if self.kind(x) == Some(K::DefaultArg) {
                x = x.and_then(|x| self.l(x));
            }
            while let Some(y) = x {
                if !is_fnqual(self.k(y)) {
                    break;
                }
                if i >= 4 {
                    self.fail();
                    return;
                }
                self.mods[base + i] = self.mods[base + i - 1];
                self.mods[base + i].next = Some(base + i - 1);
                self.modifiers = Some(base + i);
                self.mods[base + i - 1].m = y;
                self.mods[base + i - 1].printed = false;
                self.mods[base + i - 1].templates = self.templates;
                i += 1;
                x = self.l(y);
            }
            match x {
                Some(x) => typed = x,
                None => {
                    self.fail();
                    return;
                }
            }
        }
        // A template name's arguments are in scope for the function type.
        let is_template = self.k(typed) == K::Template;
        let old = self.templates;
        if is_template {
            let t = self.push_tpl(Some(typed));
            self.templates = Some(t);
        }
        self.print_comp(node.r);
        if is_template {
            self.templates = old;
        }
        // Modifiers the type did not print go after it.
        while i > 0 {
            i -= 1;
            let Some(m) = self.mods.get(base + i).copied() else {
                self.fail();
                return;
            };
            if !m.printed {
                self.ch(b' ');
                self.print_mod(m.m);
            }
        }
        self.modifiers = hold;
    }

    fn print_template_param(&mut self, d: usize) {
        let n = self.nodes[d].num;
        if self.lambda_tpl_parms > n + 1 {
            // An explicit template parameter of a lambda: `$T0` etc.
            let decl = self.templates.and_then(|t| self.tpls[t].decl);
            let Some(decl) = decl else {
                self.fail();
                return;
            };
            let mut a = self.l(decl);
            let mut c = n;
            while let Some(x) = a {
                if c == 0 {
                    break;
                }
                a = self.r(x);
                c -= 1;
            }
            if let Some(x) = a {
                if self.k(x) == K::TemplatePackParm {
                    a = self.l(x);
                }
            }
            match a {
                None => self.fail(),
                Some(x) => self.print_lambda_parm_name(self.k(x), n),
            }
        } else if self.lambda_tpl_parms != 0 {
            // A generic lambda's `auto` parameter, numbered as g++ does.
            self.s("auto:");
            self.num(n + 1);
        } else {
            let mut a = self.lookup_template_argument(d);
            if let Some(x) = a {
                if self.k(x) == K::TemplateArglist {
                    a = self.index_template_argument(Some(x), self.pack_index);
                }
            }
            let Some(a) = a else {
                self.fail();
                return;
            };
            // The argument may refer to an outer template's parameters.
            let hold = self.templates;
            self.templates = hold.and_then(|t| self.tpls[t].next);
            self.print_comp(Some(a));
            self.templates = hold;
        }
    }

    fn print_reference(&mut self, d: usize) {
        let node = self.nodes[d];
        let mut dc = d;
        let mut mod_inner = None;
        let mut restore = None;
        let Some(mut sub) = node.l else {
            self.fail();
            return;
        };
        if self.lambda_tpl_parms == 0 && self.k(sub) == K::TemplateParam {
            // Reference collapsing (& + && = &) needs the argument; when
            // reached again as a substitution, the argument is looked up in
            // the scope it was first seen in.
            match self.saved_scopes.iter().position(|s| s.0 == sub) {
                None => {
                    self.save_scope(sub);
                    if self.failed {
                        return;
                    }
                }
                Some(si) => {
                    let top = self.stack.len() - 1;
                    let found = self
                        .stack
                        .iter()
                        .enumerate()
                        .rev()
                        .any(|(k, &e)| e == sub || (e == d && k != top));
                    if !found {
                        restore = Some(self.templates);
                        self.templates = self.saved_scopes[si].1;
                    }
                }
            }
            let mut a = self.lookup_template_argument(sub);
            if let Some(x) = a {
                if self.k(x) == K::TemplateArglist {
                    a = self.index_template_argument(Some(x), self.pack_index);
                }
            }
            let Some(a) = a else {
                if let Some(t) = restore {
                    self.templates = t;
                }
                self.fail();
                return;
            };
            sub = a;
        }
        if self.k(sub) == K::Reference || self.k(sub) == node.k {
            dc = sub;
        } else if self.k(sub) == K::RvalueReference {
            mod_inner = self.l(sub);
        }
        self.print_modifier(dc, mod_inner, restore);
    }

    /// A type modifier: pushed on the modifier stack, printed by the type
    /// below where it belongs, or after it.
    fn print_modifier(
        &mut self,
        dc: usize,
        mod_inner: Option<usize>,
        restore: Option<Option<usize>>,
    ) {
        let mi = self.push_mod(dc);
        self.modifiers = Some(mi);
        let inner = mod_inner.or(self.l(dc));
        self.print_comp(inner);
        let Some(m) = self.md(mi) else { return };
        if !m.printed {
            self.print_mod(dc);
        }
        self.modifiers = m.next;
        if let Some(t) = restore {
            self.templates = t;
        }
    }

    fn print_array(&mut self, d: usize) {
        // The array rides down as a modifier (for multi-dimensional arrays);
        // qualifiers of the array itself are moved onto the element type.
        let node = self.nodes[d];
        let hold = self.modifiers;
        let base = self.mods.len();
        let first = Mod {
            next: hold,
            m: d,
            printed: false,
            templates: self.templates,
        };
        self.mods.extend([first; 4]);
        self.modifiers = Some(base);
        let mut i = 1usize;
        let mut p = hold;
        while let Some(pi) = p {
            let Some(pm) = self.md(pi) else { return };
            if !matches!(self.k(pm.m), K::Restrict | K::Volatile | K::Const) {
                break;
            }
            if !pm.printed {
                if i >= 4 {
                    self.fail();
                    return;
                }
                self.mods[base + i] = pm;
                self.mods[base + i].next = self.modifiers;
                self.modifiers = Some(base + i);
                self.set_printed(pi);
                i += 1;
            }
            p = pm.next;
        }
        self.print_comp(node.r);
        self.modifiers = hold;
        let Some(m0) = self.mods.get(base).copied() else {
            self.fail();
            return;
        };
        if m0.printed {
            return;
        }
        while i > 1 {
            i -= 1;
            let Some(m) = self.mods.get(base + i).copied() else {
                self.fail();
                return;
            };
            self.print_mod(m.m);
        }
        self.print_array_type(d, self.modifiers);
    }

    fn print_unary(&mut self, d: usize) {
        let node = self.nodes[d];
        let (Some(op), Some(mut operand)) = (node.l, node.r) else {
            self.fail();
            return;
        };
        let mut code = None;
        if self.k(op) == K::Operator {
            let c = self.op_code(op);
            code = Some(c);
            if c == "ad"
                && self.k(operand) == K::TypedName
                && self.kind(self.l(operand)) == Some(K::QualName)
                && self.kind(self.r(operand)) == Some(K::FunctionType)
            {
                // The address of a function: no parameter list.
                operand = self.l(operand).unwrap_or(operand);
            }
            if self.k(operand) == K::BinaryArgs {
                // Postfix ++ / --.
                self.print_subexpr(self.l(operand));
                self.print_expr_op(Some(op));
                return;
            }
        }
        if code == Some("sZ") {
            // sizeof... of a pack: its length.
            let a = self.find_pack(Some(operand));
            let len = self.pack_length(a);
            self.num(len);
            return;
        }
        if code == Some("sP") {
            let len = self.args_length(Some(operand));
            self.num(len);
            return;
        }
        if self.k(op) != K::Cast {
            self.print_expr_op(Some(op));
        } else {
            self.ch(b'(');
            self.print_comp(self.l(op));
            self.ch(b')');
        }
        match code {
            // No parens after `::`.
            Some("gs") => self.print_comp(Some(operand)),
            Some("st") => {
                self.ch(b'(');
                self.print_comp(Some(operand));
                self.ch(b')');
            }
            _ => self.print_subexpr(Some(operand)),
        }
    }

    fn print_binary(&mut self, d: usize) {
        let node = self.nodes[d];
        let (Some(op), Some(args)) = (node.l, node.r) else {
            self.fail();
            return;
        };
        if self.k(args) != K::BinaryArgs {
            self.fail();
            return;
        }
        let code = self.op_code(op);
        if is_new_cast(code) {
            self.print_expr_op(Some(op));
            self.ch(b'<');
            self.print_comp(self.l(args));
            self.s(">(");
            self.print_comp(self.r(args));
            self.ch(b')');
            return;
        }
        if self.maybe_print_fold(d) || self.maybe_print_designated_init(d) {
            return;
        }
        // `>` is parenthesized so it cannot end a template argument list.
        let gt = self.op_name(op) == ">";
        if gt {
            self.ch(b'(');
        }
        let left = self.l(args);
        if code == "cl" && self.kind(left) == Some(K::TypedName) {
            // A call in an expression shows the function without its
            // parameter types.
            let func = left.unwrap_or(0);
            if self.kind(self.r(func)) != Some(K::FunctionType) {
                self.fail();
            }
            self.print_subexpr(self.l(func));
        } else {
            self.print_subexpr(left);
        }
        if code == "ix" {
            self.ch(b'[');
            self.print_comp(self.r(args));
            self.ch(b']');
        } else {
            if code != "cl" {
                self.print_expr_op(Some(op));
            }
            self.print_subexpr(self.r(args));
        }
        if gt {
            self.ch(b')');
        }
    }

    fn print_trinary(&mut self, d: usize) {
        let node = self.nodes[d];
        let (Some(op), Some(a1)) = (node.l, node.r) else {
            self.fail();
            return;
        };
        let a2 = self.r(a1);
        if self.k(a1) != K::TrinaryArg1 || self.kind(a2) != Some(K::TrinaryArg2) {
            self.fail();
            return;
        }
        if self.maybe_print_fold(d) || self.maybe_print_designated_init(d) {
            return;
        }
        let a2 = a2.unwrap_or(0);
        let (first, second, third) = (self.l(a1), self.l(a2), self.r(a2));
        if self.op_code(op) == "qu" {
            self.print_subexpr(first);
            self.print_expr_op(Some(op));
            self.print_subexpr(second);
            self.s(" : ");
            self.print_subexpr(third);
        } else {
            self.s("new ");
            if first.and_then(|f| self.l(f)).is_some() {
                self.print_subexpr(first);
                self.ch(b' ');
            }
            self.print_comp(second);
            if third.is_some() {
                self.print_subexpr(third);
            }
        }
    }

    fn print_literal(&mut self, d: usize) {
        let node = self.nodes[d];
        let (Some(ty), Some(val)) = (node.l, node.r) else {
            self.fail();
            return;
        };
        let neg = node.k == K::LiteralNeg;
        let mut tp = Pr::Default;
        if self.k(ty) == K::BuiltinType {
            tp = BUILTINS[self.nodes[ty].aux as usize].1;
            let is_name = self.k(val) == K::Name;
            match tp {
                Pr::Int
                | Pr::Unsigned
                | Pr::Long
                | Pr::UnsignedLong
                | Pr::LongLong
                | Pr::UnsignedLongLong
                    if is_name =>
                {
                    // Integers print as C literals: `1u`, `-2l`.
                    if neg {
                        self.ch(b'-');
                    }
                    self.print_comp(Some(val));
                    self.s(match tp {
                        Pr::Unsigned => "u",
                        Pr::Long => "l",
                        Pr::UnsignedLong => "ul",
                        Pr::LongLong => "ll",
                        Pr::UnsignedLongLong => "ull",
                        _ => "",
                    });
                    return;
                }
                Pr::Bool if is_name && !neg && self.text_len(self.nodes[val].text) == 1 => {
                    match self.text_first(self.nodes[val].text) {
                        b'0' => return self.s("false"),
                        b'1' => return self.s("true"),
                        _ => {}
                    }
                }
                _ => {}
            }
        }
        self.ch(b'(');
        self.print_comp(Some(ty));
        self.ch(b')');
        if neg {
            self.ch(b'-');
        }
        if tp == Pr::Float {
            self.ch(b'[');
        }
        self.print_comp(Some(val));
        if tp == Pr::Float {
            self.ch(b']');
        }
    }

    fn print_lambda(&mut self, d: usize) {
        let node = self.nodes[d];
        self.s("{lambda");
        let mut parms = node.l;
        // Generic lambdas' `auto` parameters are template parameters: the
        // printer must know it is in a lambda and how many are explicit.
        let saved = self.lambda_tpl_parms;
        self.lambda_tpl_parms = 0;
        let old = self.templates;
        let dpt = self.push_tpl(None);
        self.templates = Some(dpt);
        if let Some(p) = parms {
            if self.k(p) == K::TemplateHead {
                self.tpls[dpt].decl = Some(p);
                self.ch(b'<');
                let mut parm = self.l(p);
                while let Some(mut pm) = parm {
                    let prev = self.lambda_tpl_parms;
                    self.lambda_tpl_parms += 1;
                    if prev != 0 {
                        self.s(", ");
                    }
                    self.print_comp(Some(pm));
                    self.ch(b' ');
                    if self.k(pm) == K::TemplatePackParm {
                        // libiberty continues the walk from the pack's
                        // element, whose list ends there.
                        match self.l(pm) {
                            Some(x) => pm = x,
                            None => {
                                self.fail();
                                return;
                            }
                        }
                    }
                    self.print_lambda_parm_name(self.k(pm), self.lambda_tpl_parms - 1);
                    parm = self.r(pm);
                }
                self.ch(b'>');
                parms = self.r(p);
            }
        }
        self.lambda_tpl_parms += 1;
        self.ch(b'(');
        self.print_comp(parms);
        self.lambda_tpl_parms = saved;
        self.templates = old;
        self.s(")#");
        self.num(node.num + 1);
        self.ch(b'}');
    }

    fn print_mod_list(&mut self, mut mods: Option<usize>, suffix: bool) {
        while let Some(mi) = mods {
            if self.failed {
                return;
            }
            let Some(m) = self.md(mi) else { return };
            let mk = self.k(m.m);
            if m.printed || (!suffix && is_fnqual(mk)) {
                mods = m.next;
                continue;
            }
            self.set_printed(mi);
            let hold = self.templates;
            self.templates = m.templates;
            match mk {
                K::FunctionType => {
                    self.print_function_type(m.m, m.next);
                    self.templates = hold;
                    return;
                }
                K::ArrayType => {
                    self.print_array_type(m.m, m.next);
                    self.templates = hold;
                    return;
                }
                K::LocalName => {
                    // Its qualifiers were taken off already; the function
                    // part must not see any modifiers.
                    let hm = self.modifiers;
                    self.modifiers = None;
                    self.print_comp(self.l(m.m));
                    self.modifiers = hm;
                    self.s("::");
                    let mut dc = self.r(m.m);
                    if let Some(x) = dc {
                        if self.k(x) == K::DefaultArg {
                            self.s("{default arg#");
                            self.num(self.nodes[x].num + 1);
                            self.s("}::");
                            dc = self.l(x);
                        }
                    }
                    while let Some(x) = dc {
                        if !is_fnqual(self.k(x)) {
                            break;
                        }
                        dc = self.l(x);
                    }
                    self.print_comp(dc);
                    self.templates = hold;
                    return;
                }
                _ => {}
            }
            self.print_mod(m.m);
            self.templates = hold;
            mods = m.next;
        }
    }

    fn print_mod(&mut self, m: usize) {
        use K::*;
        let node = self.nodes[m];
        match node.k {
            Restrict | RestrictThis => self.s(" restrict"),
            Volatile | VolatileThis => self.s(" volatile"),
            Const | ConstThis => self.s(" const"),
            TransactionSafe => self.s(" transaction_safe"),
            Noexcept | ThrowSpec => {
                self.s(if node.k == Noexcept {
                    " noexcept"
                } else {
                    " throw"
                });
                if node.r.is_some() {
                    self.ch(b'(');
                    self.print_comp(node.r);
                    self.ch(b')');
                }
            }
            VendorTypeQual => {
                self.ch(b' ');
                self.print_comp(node.r);
            }
            Pointer => self.ch(b'*'),
            ReferenceThis => self.s(" &"),
            Reference => self.ch(b'&'),
            RvalueReferenceThis => self.s(" &&"),
            RvalueReference => self.s("&&"),
            Complex => self.s(" _Complex"),
            Imaginary => self.s(" _Imaginary"),
            PtrmemType => {
                if self.last_char != b'(' {
                    self.ch(b' ');
                }
                self.print_comp(node.l);
                self.s("::*");
            }
            TypedName => self.print_comp(node.l),
            VectorType => {
                self.s(" __vector(");
                self.print_comp(node.l);
                self.ch(b')');
            }
            _ => self.print_comp(Some(m)),
        }
    }

    fn print_function_type(&mut self, dc: usize, mods: Option<usize>) {
        let mut need_paren = false;
        let mut need_space = false;
        let mut p = mods;
        while let Some(pi) = p {
            let Some(pm) = self.md(pi) else { return };
            if pm.printed {
                break;
            }
            match self.k(pm.m) {
                K::Pointer | K::Reference | K::RvalueReference => need_paren = true,
                K::Restrict
                | K::Volatile
                | K::Const
                | K::VendorTypeQual
                | K::Complex
                | K::Imaginary
                | K::PtrmemType => {
                    need_space = true;
                    need_paren = true;
                }
                _ => {}
            }
            if need_paren {
                break;
            }
            p = pm.next;
        }
        if need_paren {
            if !need_space && self.last_char != b'(' && self.last_char != b'*' {
                need_space = true;
            }
            if need_space && self.last_char != b' ' {
                self.ch(b' ');
            }
            self.ch(b'(');
        }
        let hold = self.modifiers;
        self.modifiers = None;
        self.print_mod_list(mods, false);
        if need_paren {
            self.ch(b')');
        }
        self.ch(b'(');
        if self.r(dc).is_some() {
            self.print_comp(self.r(dc));
        }
        self.ch(b')');
        self.print_mod_list(mods, true);
        self.modifiers = hold;
    }

    fn print_array_type(&mut self, dc: usize, mods: Option<usize>) {
        let mut need_space = true;
        if mods.is_some() {
            let mut need_paren = false;
            let mut p = mods;
            while let Some(pi) = p {
                let Some(pm) = self.md(pi) else { return };
                if !pm.printed {
                    if self.k(pm.m) == K::ArrayType {
                        need_space = false;
                    } else {
                        need_paren = true;
                        need_space = true;
                    }
                    break;
                }
                p = pm.next;
            }
            if need_paren {
                self.s(" (");
            }
            self.print_mod_list(mods, false);
            if need_paren {
                self.ch(b')');
            }
        }
        if need_space {
            self.ch(b' ');
        }
        self.ch(b'[');
        if self.l(dc).is_some() {
            self.print_comp(self.l(dc));
        }
        self.ch(b']');
    }

    fn print_expr_op(&mut self, dc: Option<usize>) {
        match dc {
            Some(d) if self.k(d) == K::Operator => {
                let name = self.op_name(d);
                self.s(name);
            }
            _ => self.print_comp(dc),
        }
    }

    fn print_conversion(&mut self, dc: usize) {
        // The enclosing template's parameters are in scope for the type.
        let cur = self.current_template;
        let old = self.templates;
        if cur.is_some() {
            let t = self.push_tpl(cur);
            self.templates = Some(t);
        }
        self.print_comp(self.l(dc));
        if cur.is_some() {
            self.templates = old;
        }
    }
}
