//! Serde helper: byte vectors as lowercase hex strings (JSON cannot hold NaN or
//! infinities, and a hex string is far smaller than an array of numbers).

use serde::{de::Error, Deserialize, Deserializer, Serializer};

pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
    s.serialize_str(&out)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let s = String::deserialize(d)?;
    if s.len() % 2 != 0 {
        return Err(D::Error::custom("hex string of odd length"));
    }
    let digit = |c: u8| -> Result<u8, D::Error> {
        (c as char)
            .to_digit(16)
            .map(|v| v as u8)
            .ok_or_else(|| D::Error::custom(format!("invalid hex digit {:?}", c as char)))
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Ok(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}
