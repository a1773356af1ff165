//! Just enough of the Kubernetes protobuf encoding to read what kubectl posts that way
//! (`kubectl create namespace`, `kubectl create secret`, `kubectl create configmap`,
//! `kubectl auth can-i`): the `k8s\0` envelope and the fields of those few kinds. Answers
//! stay JSON (kubectl accepts them).

use base64::Engine as _;
use serde_json::{Map, Value, json};

/// One field: its number and its value (varint or bytes).
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(data: &[u8], at: &mut usize) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *data.get(*at).ok_or("truncated varint")?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("varint too long".into())
}

fn fields(data: &[u8]) -> Result<Vec<(u64, Field<'_>)>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let key = varint(data, &mut at)?;
        let (number, wire) = (key >> 3, key & 7);
        match wire {
            0 => out.push((number, Field::Varint(varint(data, &mut at)?))),
            2 => {
                let len =
                    usize::try_from(varint(data, &mut at)?).map_err(|_| "length too large")?;
                let end = at
                    .checked_add(len)
                    .filter(|e| *e <= data.len())
                    .ok_or("truncated field")?;
                out.push((number, Field::Bytes(&data[at..end])));
                at = end;
            }
            1 => at += 8,
            5 => at += 4,
            other => return Err(format!("unsupported wire type {other}")),
        }
    }
    Ok(out)
}

fn text(bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| "a string field is not UTF-8".to_owned())
}

/// A `map<string, V>` entry: key 1, value 2.
fn entry(bytes: &[u8]) -> Result<(String, Vec<u8>), String> {
    let (mut key, mut value) = (String::new(), Vec::new());
    for (n, f) in fields(bytes)? {
        match (n, f) {
            (1, Field::Bytes(b)) => key = text(b)?,
            (2, Field::Bytes(b)) => value = b.to_vec(),
            _ => {}
        }
    }
    Ok((key, value))
}

fn object_meta(bytes: &[u8]) -> Result<Value, String> {
    let mut meta = Map::new();
    let (mut labels, mut annotations) = (Map::new(), Map::new());
    for (n, f) in fields(bytes)? {
        if let Field::Bytes(b) = f {
            match n {
                1 => drop(meta.insert("name".into(), json!(text(b)?))),
                2 => drop(meta.insert("generateName".into(), json!(text(b)?))),
                3 => drop(meta.insert("namespace".into(), json!(text(b)?))),
                11 | 12 => {
                    let (k, v) = entry(b)?;
                    let map = if n == 11 {
                        &mut labels
                    } else {
                        &mut annotations
                    };
                    map.insert(k, json!(text(&v)?));
                }
                _ => {}
            }
        }
    }
    if !labels.is_empty() {
        meta.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        meta.insert("annotations".into(), Value::Object(annotations));
    }
    Ok(Value::Object(meta))
}

fn resource_attributes(bytes: &[u8]) -> Result<Value, String> {
    let names = [
        "",
        "namespace",
        "verb",
        "group",
        "version",
        "resource",
        "subresource",
        "name",
    ];
    let mut out = Map::new();
    for (n, f) in fields(bytes)? {
        if let (Some(name), Field::Bytes(b)) = (names.get(usize::try_from(n).unwrap_or(0)), f)
            && !name.is_empty()
        {
            out.insert((*name).to_owned(), json!(text(b)?));
        }
    }
    Ok(Value::Object(out))
}

/// Decodes a protobuf body of `kind` into its JSON form.
///
/// # Errors
///
/// Not the envelope, another kind, or a malformed message.
pub fn decode(body: &[u8], expected_kind: &str) -> Result<Value, String> {
    let raw_message = body
        .strip_prefix(b"k8s\0")
        .ok_or("not a Kubernetes protobuf envelope")?;
    let (mut kind, mut api_version, mut raw) = (String::new(), String::new(), &[][..]);
    for (n, f) in fields(raw_message)? {
        match (n, f) {
            (1, Field::Bytes(type_meta)) => {
                for (m, g) in fields(type_meta)? {
                    match (m, g) {
                        (1, Field::Bytes(b)) => api_version = text(b)?,
                        (2, Field::Bytes(b)) => kind = text(b)?,
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    if !kind.is_empty() && kind != expected_kind {
        return Err(format!("the body holds a {kind}, not a {expected_kind}"));
    }
    let mut object = json!({"apiVersion": api_version, "kind": expected_kind});
    let b64 = |b: &[u8]| json!(base64::engine::general_purpose::STANDARD.encode(b));
    let (mut data, mut string_data, mut binary_data) = (Map::new(), Map::new(), Map::new());
    for (n, f) in fields(raw)? {
        match (expected_kind, n, f) {
            (_, 1, Field::Bytes(b)) => object["metadata"] = object_meta(b)?,
            ("Secret", 2, Field::Bytes(b)) => {
                let (k, v) = entry(b)?;
                data.insert(k, b64(&v));
            }
            ("Secret", 3, Field::Bytes(b)) => object["type"] = json!(text(b)?),
            ("Secret", 4, Field::Bytes(b)) => {
                let (k, v) = entry(b)?;
                string_data.insert(k, json!(text(&v)?));
            }
            ("Secret" | "ConfigMap", n @ (4 | 5), Field::Varint(v))
                if (expected_kind == "Secret") == (n == 5) =>
            {
                object["immutable"] = json!(v != 0);
            }
            ("ConfigMap", 2, Field::Bytes(b)) => {
                let (k, v) = entry(b)?;
                data.insert(k, json!(text(&v)?));
            }
            ("ConfigMap", 3, Field::Bytes(b)) => {
                let (k, v) = entry(b)?;
                binary_data.insert(k, b64(&v));
            }
            ("SelfSubjectAccessReview", 2, Field::Bytes(spec)) => {
                for (m, g) in fields(spec)? {
                    if let (1, Field::Bytes(attrs)) = (m, g) {
                        object["spec"] = json!({"resourceAttributes": resource_attributes(attrs)?});
                    }
                }
            }
            _ => {}
        }
    }
    for (name, map) in [
        ("data", data),
        ("stringData", string_data),
        ("binaryData", binary_data),
    ] {
        if !map.is_empty() {
            object[name] = Value::Object(map);
        }
    }
    Ok(object)
}

/// The kinds [`decode`] reads.
pub fn readable(kind: &str) -> bool {
    matches!(
        kind,
        "Namespace" | "Secret" | "ConfigMap" | "SelfSubjectAccessReview"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![number << 3 | 2, u8::try_from(bytes.len()).expect("short")];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn a_secret_in_its_envelope_decodes() {
        let meta = [
            field(1, b"s1"),
            field(11, &[field(1, b"app"), field(2, b"x")].concat()),
        ]
        .concat();
        let secret = [
            field(1, &meta),
            field(2, &[field(1, b"a"), field(2, b"b")].concat()),
            field(3, b"Opaque"),
        ]
        .concat();
        let type_meta = [field(1, b"v1"), field(2, b"Secret")].concat();
        let body = [b"k8s\0".to_vec(), field(1, &type_meta), field(2, &secret)].concat();
        let object = decode(&body, "Secret").expect("decodes");
        assert_eq!(
            object["metadata"],
            json!({"name": "s1", "labels": {"app": "x"}})
        );
        assert_eq!(object["data"], json!({"a": "Yg=="}));
        assert_eq!(object["type"], "Opaque");
        assert!(decode(&body, "Namespace").is_err());
        assert!(decode(b"{}", "Secret").is_err());
    }
}
