//! Test data captured from the kernel's rxe (in the rxe VM): lines `TAG NAME HEX` of a text
//! file, each the bytes of one frame or datagram, named.

/// The `(name, bytes)` of each line of `text` that begins with `tag`.
pub(crate) fn tagged_hex(text: &str, tag: &str) -> Vec<(String, Vec<u8>)> {
    text.lines()
        .filter_map(|l| l.strip_prefix(tag)?.strip_prefix(' '))
        .map(|l| {
            let (what, hex) = l.split_once(' ').expect("NAME HEX");
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            (what.to_owned(), bytes)
        })
        .collect()
}
