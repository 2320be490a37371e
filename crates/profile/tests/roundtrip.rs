//! `Profile` reads and writes Cachegrind's exact layout: profiles written
//! by Valgrind 3.19 come back byte for byte.

use std::path::Path;

use profile::Profile;

#[test]
fn valgrind_profiles_round_trip_exactly() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cachescope/tests/golden/real");
    for name in [
        "full.cgout",
        "run2.cgout",
        "run5.cgout",
        "ir.cgout",
        "nodesc.cgout",
    ] {
        let original = std::fs::read(dir.join(name)).unwrap();
        let profile = Profile::read_from(&original[..]).unwrap();
        let mut written = Vec::new();
        profile.write_to(&mut written).unwrap();
        assert!(written == original, "{name} does not round-trip");
    }
}
