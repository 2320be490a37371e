//! The `cachegrind.out` reader on arbitrary bytes: it must return records
//! or an error, never panic, and agree with `Profile::read_from`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use profile::reader::CgoutReader;
use profile::Profile;

fuzz_target!(|data: &[u8]| {
    let mut streamed_ok = false;
    if let Ok((mut reader, header)) = CgoutReader::new(data) {
        let mut summary = false;
        loop {
            match reader.next_record() {
                Ok(Some(profile::reader::Record::Counts { counts, .. })) => {
                    assert_eq!(counts.len(), header.events.len());
                }
                Ok(Some(profile::reader::Record::Summary(_))) => summary = true,
                Ok(Some(_)) => {}
                Ok(None) => {
                    streamed_ok = summary;
                    break;
                }
                Err(_) => break,
            }
        }
    }
    if let Ok(p) = Profile::read_from(data) {
        assert!(streamed_ok, "read_from accepted what the stream rejected");
        // What was read writes out and reads back the same.
        let mut out = Vec::new();
        p.write_to(&mut out).unwrap();
        let again = Profile::read_from(&out[..]).expect("written profiles read back");
        assert_eq!(again.costs, p.costs);
    }
});
