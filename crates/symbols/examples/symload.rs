//! Times loading objects: `cargo run --release --example symload -- PATH...`.
fn main() {
    for p in std::env::args().skip(1) {
        let t = std::time::Instant::now();
        let o = symbols::ObjectInfo::load(std::path::Path::new(&p)).unwrap();
        println!("{p}: {:?} (debug file {:?})", t.elapsed(), o.debug_path());
    }
}
