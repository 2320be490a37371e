//! Builds the calling-context runtime blob (`runtime/blob.rs` over the
//! `ctxrt` and `callrules` crates) with the toolchain's own `rustc` and
//! `rust-lld`: position-independent code without relocations, flattened
//! into the bytes the tracer maps into the client (`runtime::BLOB`).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    let crates = manifest.parent().expect("crates/").to_path_buf();
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    for dir in ["callrules/src", "ctxrt/src"] {
        for f in fs::read_dir(crates.join(dir)).expect("sources") {
            println!(
                "cargo:rerun-if-changed={}",
                f.expect("entry").path().display()
            );
        }
    }
    println!("cargo:rerun-if-changed=runtime/blob.rs");
    println!("cargo:rerun-if-changed=build.rs");

    let common = [
        "--edition=2021",
        "-Copt-level=3",
        "-Cpanic=abort",
        "-Crelocation-model=pie",
        "-Cdebug-assertions=off",
        "-Coverflow-checks=off",
        "-Ccodegen-units=1",
        "--cap-lints=allow",
    ];
    let run = |args: &[&str]| {
        let status = Command::new(&rustc)
            .args(common)
            .args(args)
            .status()
            .expect("rustc runs");
        assert!(status.success(), "rustc {args:?} failed");
    };
    let o = |name: &str| out.join(name).display().to_string();
    let src = |p: &str| crates.join(p).display().to_string();
    run(&[
        "--crate-type=rlib",
        "--crate-name=callrules",
        &src("callrules/src/lib.rs"),
        "-o",
        &o("libcallrules.rlib"),
    ]);
    run(&[
        "--crate-type=rlib",
        "--crate-name=ctxrt",
        &src("ctxrt/src/lib.rs"),
        "--extern",
        &format!("callrules={}", o("libcallrules.rlib")),
        "-o",
        &o("libctxrt.rlib"),
    ]);
    run(&[
        "--crate-type=staticlib",
        "--crate-name=blob",
        &manifest.join("runtime/blob.rs").display().to_string(),
        "-L",
        &out.display().to_string(),
        "--extern",
        &format!("ctxrt={}", o("libctxrt.rlib")),
        "-o",
        &o("libblob.a"),
    ]);
    let sysroot = Command::new(&rustc)
        .arg("--print=sysroot")
        .output()
        .expect("rustc runs");
    let sysroot = String::from_utf8(sysroot.stdout).expect("a path");
    let host = env::var("HOST").expect("cargo sets it");
    let lld = Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(&host)
        .join("bin/rust-lld");
    let status = Command::new(&lld)
        .args([
            "-flavor",
            "gnu",
            "-pie",
            "--no-dynamic-linker",
            "--gc-sections",
        ])
        .args(["-z", "norelro", "-e", "cs_runtime", "-o"])
        .arg(out.join("blob.elf"))
        .arg(out.join("libblob.a"))
        .status()
        .unwrap_or_else(|e| panic!("{} runs: {e}", lld.display()));
    assert!(status.success(), "rust-lld failed");
    let elf = fs::read(out.join("blob.elf")).expect("linked");
    let Flat {
        image,
        entry,
        relative,
        code,
        formatting,
    } = flatten(&elf);
    fs::write(out.join("blob.bin"), &image).expect("written");
    fs::write(
        out.join("blob.rs"),
        format!(
            "/// The runtime's code and data, to be mapped at any address.\n\
             pub const BLOB: &[u8] = include_bytes!(concat!(env!(\"OUT_DIR\"), \"/blob.bin\"));\n\
             /// Offset of `cs_runtime` in [`BLOB`].\n\
             pub const ENTRY: u64 = {entry};\n\
             /// Words of [`BLOB`] to set to its address plus an addend: (offset, addend).\n\
             pub const RELATIVE: &[(u64, u64)] = &{relative:?};\n\
             /// The executable ranges (start, end) of [`BLOB`].\n\
             pub const CODE: &[(u64, u64)] = &{code:?};\n\
             /// The ranges (start, end) of `core::fmt`'s functions in [`BLOB`].\n\
             pub const FORMATTING: &[(u64, u64)] = &{formatting:?};\n"
        ),
    )
    .expect("written");
}

fn u16_at(b: &[u8], at: usize) -> u64 {
    u64::from(u16::from_le_bytes(
        b[at..at + 2].try_into().expect("2 bytes"),
    ))
}
fn u32_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32::from_le_bytes(
        b[at..at + 4].try_into().expect("4 bytes"),
    ))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The loadable segments of a 64-bit little-endian ELF laid out at their
/// addresses from 0 (zero-filled between and after), its entry, and its
/// relative relocations (offset, addend): words to set to the load address
/// plus the addend, and the ranges (start, end) of its executable
/// segments. Refuses any other relocation.
fn flatten(elf: &[u8]) -> Flat {
    assert_eq!(&elf[..4], b"\x7fELF", "an ELF file");
    let entry = u64_at(elf, 0x18);
    let (phoff, phentsize, phnum) = (u64_at(elf, 0x20), u16_at(elf, 0x36), u16_at(elf, 0x38));
    let (shoff, shentsize, shnum) = (u64_at(elf, 0x28), u16_at(elf, 0x3a), u16_at(elf, 0x3c));
    let mut relative = Vec::new();
    let mut formatting = Vec::new();
    for i in 0..shnum {
        let sh = (shoff + i * shentsize) as usize;
        let (kind, off, size) = (
            u32_at(elf, sh + 4),
            u64_at(elf, sh + 0x18),
            u64_at(elf, sh + 0x20),
        );
        match kind {
            // SHT_RELA: only R_X86_64_RELATIVE (the load address plus an
            // addend), which the loader applies.
            4 => {
                for e in (off..off + size).step_by(24) {
                    let e = e as usize;
                    let (at, info, addend) =
                        (u64_at(elf, e), u64_at(elf, e + 8), u64_at(elf, e + 16));
                    assert_eq!(
                        info & 0xffff_ffff,
                        8,
                        "the runtime blob needs a symbol relocation"
                    );
                    relative.push((at, addend));
                }
            }
            // SHT_SYMTAB: the functions of `core::fmt` (and the character
            // counting its padding uses), linked for panic messages.
            2 => {
                let strtab = (shoff + u32_at(elf, sh + 0x28) * shentsize) as usize;
                let names = u64_at(elf, strtab + 0x18) as usize;
                for e in (off..off + size).step_by(24) {
                    let e = e as usize;
                    let name_at = names + u32_at(elf, e) as usize;
                    let len = elf[name_at..].iter().position(|&b| b == 0).unwrap_or(0);
                    let name = String::from_utf8_lossy(&elf[name_at..name_at + len]);
                    let function = elf[e + 4] & 0xf == 2;
                    if function && (name.contains("4core3fmt") || name.contains("4core3str5count"))
                    {
                        let start = u64_at(elf, e + 8);
                        formatting.push((start, start + u64_at(elf, e + 16)));
                    }
                }
            }
            // SHT_REL, SHT_RELR
            9 | 19 if size > 0 => {
                panic!("the runtime blob has relocations of a form the loader does not apply")
            }
            _ => {}
        }
    }
    let mut image = Vec::new();
    let mut code = Vec::new();
    for i in 0..phnum {
        let ph = (phoff + i * phentsize) as usize;
        if u32_at(elf, ph) != 1 {
            continue; // PT_LOAD only
        }
        let (off, vaddr) = (
            u64_at(elf, ph + 8) as usize,
            u64_at(elf, ph + 0x10) as usize,
        );
        let (filesz, memsz) = (
            u64_at(elf, ph + 0x20) as usize,
            u64_at(elf, ph + 0x28) as usize,
        );
        if u32_at(elf, ph + 4) & 1 != 0 {
            code.push((vaddr as u64, (vaddr + filesz) as u64)); // PF_X
        }
        if image.len() < vaddr + memsz {
            image.resize(vaddr + memsz, 0);
        }
        image[vaddr..vaddr + filesz].copy_from_slice(&elf[off..off + filesz]);
    }
    formatting.sort_unstable();
    Flat {
        image,
        entry,
        relative,
        code,
        formatting,
    }
}

/// A linked blob laid out flat ([`flatten`]).
struct Flat {
    image: Vec<u8>,
    entry: u64,
    /// (offset, addend) of each relative relocation.
    relative: Vec<(u64, u64)>,
    /// (start, end) of each executable segment.
    code: Vec<(u64, u64)>,
    /// (start, end) of each function of `core::fmt`.
    formatting: Vec<(u64, u64)>,
}
