//! The Confluent wire format every schema-registry serializer writes, Confluent's and
//! Apicurio's `ccompat` clients alike: magic byte `0x00`, the schema id as 4 bytes big-endian,
//! then the payload. A Protobuf payload starts with the message-index list, which says which
//! message of the schema's file the record is: a count, then that many indexes, each a zigzag
//! varint; the common case, the file's first message (`[0]`), is written as a lone `0`.
//!
//! Pure byte work, no registry: the caller looks the id up (cached, [`crate::RegistryClient`]).

use crate::error::SchemaError;
use crate::schema_id::SchemaId;

/// The first byte of every framed record.
pub const MAGIC_BYTE: u8 = 0;
/// Magic byte and schema id.
pub const HEADER_LEN: usize = 5;

/// A record's value split into the schema id it names and the payload after the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framed<'a> {
    pub schema_id: SchemaId,
    pub payload: &'a [u8],
}

/// `bytes` split into schema id and payload; an error when they are not the wire format (a
/// plain-JSON record starts with `{`, never with `0x00`).
pub fn unframe(bytes: &[u8]) -> Result<Framed<'_>, SchemaError> {
    let Some((header, payload)) = bytes.split_first_chunk::<HEADER_LEN>() else {
        return Err(SchemaError::WireFormat(format!(
            "{} bytes, shorter than the 5-byte header",
            bytes.len()
        )));
    };
    let [magic, id @ ..] = *header;
    if magic != MAGIC_BYTE {
        return Err(SchemaError::WireFormat(format!(
            "first byte is {magic:#04x}, not the magic byte 0x00"
        )));
    }
    Ok(Framed {
        schema_id: SchemaId(u32::from_be_bytes(id)),
        payload,
    })
}

/// Appends the header naming `schema_id` to `out`; the payload follows it.
pub fn write_header(schema_id: SchemaId, out: &mut Vec<u8>) {
    out.push(MAGIC_BYTE);
    out.extend_from_slice(&schema_id.0.to_be_bytes());
}

/// `payload` framed with the header naming `schema_id`.
pub fn frame(schema_id: SchemaId, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    write_header(schema_id, &mut out);
    out.extend_from_slice(payload);
    out
}

/// Appends a Protobuf payload's message-index list: which message of the schema's file (the
/// first top-level message is `[0]`, the second nested message of the third is `[2, 1]`).
/// Written as Confluent's serializers write it, so their deserializers read it: `[0]` as a lone
/// zero, anything else as its length and then its indexes, each a zigzag varint.
pub fn write_message_indexes(indexes: &[u32], out: &mut Vec<u8>) -> Result<(), SchemaError> {
    if indexes == [0] {
        write_zigzag_varint(0, out);
        return Ok(());
    }
    let as_i32 = |n: usize| {
        i32::try_from(n).map_err(|_| {
            SchemaError::WireFormat(format!("message index {n} is beyond the format's 32 bits"))
        })
    };
    write_zigzag_varint(as_i32(indexes.len())?, out);
    for &index in indexes {
        write_zigzag_varint(as_i32(index as usize)?, out);
    }
    Ok(())
}

/// A Protobuf payload's message-index list and the message's bytes after it. A count of zero
/// means `[0]`, the file's first message.
pub fn read_message_indexes(payload: &[u8]) -> Result<(Vec<u32>, &[u8]), SchemaError> {
    let (count, mut rest) = read_zigzag_varint(payload)?;
    if count == 0 {
        return Ok((vec![0], rest));
    }
    let count = usize::try_from(count)
        .map_err(|_| SchemaError::WireFormat(format!("message-index count {count} is negative")))?;
    // Each index takes at least a byte: a count beyond what is left is a broken record, and
    // must not size an allocation.
    if count > rest.len() {
        return Err(SchemaError::WireFormat(format!(
            "message-index count {count} exceeds the {} bytes left",
            rest.len()
        )));
    }
    let mut indexes = Vec::with_capacity(count);
    for _ in 0..count {
        let (index, after) = read_zigzag_varint(rest)?;
        let index = u32::try_from(index)
            .map_err(|_| SchemaError::WireFormat(format!("message index {index} is negative")))?;
        indexes.push(index);
        rest = after;
    }
    Ok((indexes, rest))
}

fn write_zigzag_varint(value: i32, out: &mut Vec<u8>) {
    // Zigzag: 0, -1, 1, -2, ... become 0, 1, 2, 3, ..., so small magnitudes take one byte.
    let mut zigzag = ((value << 1) ^ (value >> 31)) as u32;
    while zigzag >= 0x80 {
        out.push((zigzag as u8 & 0x7f) | 0x80);
        zigzag >>= 7;
    }
    out.push(zigzag as u8);
}

/// A 32-bit zigzag varint (at most 5 bytes, as Confluent's `ByteUtils.readVarint` reads one) and
/// the bytes after it.
fn read_zigzag_varint(bytes: &[u8]) -> Result<(i32, &[u8]), SchemaError> {
    let mut zigzag: u32 = 0;
    for (position, &byte) in bytes.iter().enumerate().take(5) {
        let bits = u32::from(byte & 0x7f);
        if position == 4 && bits > 0x0f {
            return Err(SchemaError::WireFormat(
                "a message-index varint is beyond 32 bits".into(),
            ));
        }
        zigzag |= bits << (7 * position);
        if byte & 0x80 == 0 {
            let value = ((zigzag >> 1) as i32) ^ -((zigzag & 1) as i32);
            return Ok((value, &bytes[position + 1..]));
        }
    }
    Err(SchemaError::WireFormat(if bytes.len() < 5 {
        "the message-index list ends inside a varint".into()
    } else {
        "a message-index varint is longer than 5 bytes".into()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_magic_byte_big_endian_id_and_payload() {
        let framed = frame(SchemaId(0x0102_0304), b"avro");
        assert_eq!(framed, b"\x00\x01\x02\x03\x04avro");
        let back = unframe(&framed).expect("framed bytes unframe");
        assert_eq!(back.schema_id, SchemaId(0x0102_0304));
        assert_eq!(back.payload, b"avro");
    }

    #[test]
    fn an_empty_payload_is_a_frame_too() {
        // Avro encodes a record without fields, or a null, as no bytes at all.
        let back = unframe(b"\x00\x00\x00\x00\x07").expect("header only");
        assert_eq!((back.schema_id, back.payload), (SchemaId(7), &b""[..]));
    }

    #[test]
    fn plain_json_and_short_records_are_not_the_wire_format() {
        for bytes in [
            &b"{\"a\":1}"[..],
            b"",
            b"\x00\x00\x00\x01",
            b"\x01\x00\x00\x00\x01x",
        ] {
            let error = unframe(bytes).expect_err("not framed");
            assert!(matches!(error, SchemaError::WireFormat(_)), "{error}");
            assert!(!error.is_transient());
        }
    }

    fn indexes_bytes(indexes: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        write_message_indexes(indexes, &mut out).expect("encodable");
        out
    }

    #[test]
    fn message_indexes_are_written_as_confluents_serializers_write_them() {
        // The first message: one zero byte, not [count 1, index 0].
        assert_eq!(indexes_bytes(&[0]), [0x00]);
        // Count 1 (zigzag 2), index 1 (zigzag 2).
        assert_eq!(indexes_bytes(&[1]), [0x02, 0x02]);
        // Count 2, indexes 2 and 0 (a nested message: the first of the third).
        assert_eq!(indexes_bytes(&[2, 0]), [0x04, 0x04, 0x00]);
        // Index 64 zigzags to 128, two varint bytes.
        assert_eq!(indexes_bytes(&[64]), [0x02, 0x80, 0x01]);
    }

    #[test]
    fn message_indexes_round_trip_and_leave_the_message_bytes() {
        for indexes in [
            vec![0],
            vec![1],
            vec![0, 0],
            vec![3, 1, 4],
            vec![63, 64, 8191, 8192],
            vec![i32::MAX as u32],
        ] {
            let mut bytes = indexes_bytes(&indexes);
            bytes.extend_from_slice(b"msg");
            let (read, rest) = read_message_indexes(&bytes).expect("readable");
            assert_eq!(read, indexes);
            assert_eq!(rest, b"msg");
        }
    }

    #[test]
    fn a_count_of_zero_reads_as_the_first_message() {
        let (read, rest) = read_message_indexes(&[0x00, 0x08, 0x96]).expect("readable");
        assert_eq!(read, [0]);
        assert_eq!(rest, [0x08, 0x96]);
    }

    #[test]
    fn broken_message_index_lists_are_refused() {
        for bytes in [
            // Empty, or a varint cut short.
            &[][..],
            &[0x80],
            // A count of 100 with one byte left.
            &[0xc8, 0x01, 0x00],
            // A negative count (zigzag 1 is -1) and a negative index.
            &[0x01],
            &[0x02, 0x03],
            // Six varint bytes, and a fifth byte carrying bits beyond 32.
            &[0x80, 0x80, 0x80, 0x80, 0x80, 0x00],
            &[0xff, 0xff, 0xff, 0xff, 0x7f],
        ] {
            let error = read_message_indexes(bytes).expect_err("broken");
            assert!(
                matches!(error, SchemaError::WireFormat(_)),
                "{bytes:?}: {error}"
            );
        }
    }

    #[test]
    fn an_index_beyond_32_bits_is_not_written() {
        let mut out = Vec::new();
        assert!(write_message_indexes(&[u32::MAX], &mut out).is_err());
    }
}
