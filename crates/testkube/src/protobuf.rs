//! Decoding of Kubernetes protobuf request bodies into JSON for the few kinds kubectl
//! 1.32+ sends that way (`kubectl create namespace|configmap|secret|serviceaccount|role|
//! rolebinding`, `kubectl auth can-i`). The envelope is `k8s\0` and a `runtime.Unknown`
//! whose `raw` holds the object (`staging/src/k8s.io/apimachinery/pkg/runtime/serializer/protobuf`).
//! Field numbers come from the types' `generated.proto`. Responses stay JSON.

use serde_json::{Map, Value};

/// A body that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// Not the `k8s\0` envelope or truncated.
    #[error("malformed protobuf body: {0}")]
    Malformed(&'static str),
    /// A kind this double does not decode from protobuf.
    #[error("protobuf bodies of kind {0} are not supported by this API double; send JSON")]
    UnsupportedKind(String),
}

#[derive(Clone, Copy)]
enum F {
    Str,
    Int,
    Bool,
    Msg(&'static [(u32, &'static str, F)]),
    RepStr,
    RepMsg(&'static [(u32, &'static str, F)]),
    MapStrStr,
    MapStrBytes,
}

type Schema = &'static [(u32, &'static str, F)];

const OWNER_REF: Schema = &[
    (1, "kind", F::Str),
    (3, "name", F::Str),
    (4, "uid", F::Str),
    (5, "apiVersion", F::Str),
    (6, "controller", F::Bool),
    (7, "blockOwnerDeletion", F::Bool),
];
const META: Schema = &[
    (1, "name", F::Str),
    (2, "generateName", F::Str),
    (3, "namespace", F::Str),
    (5, "uid", F::Str),
    (6, "resourceVersion", F::Str),
    (7, "generation", F::Int),
    (11, "labels", F::MapStrStr),
    (12, "annotations", F::MapStrStr),
    (13, "ownerReferences", F::RepMsg(OWNER_REF)),
    (14, "finalizers", F::RepStr),
];
const NAME_REF: Schema = &[(1, "name", F::Str)];
const OBJECT_REF: Schema = &[
    (1, "kind", F::Str),
    (2, "namespace", F::Str),
    (3, "name", F::Str),
    (4, "uid", F::Str),
    (5, "apiVersion", F::Str),
];
const NAMESPACE: Schema = &[
    (1, "metadata", F::Msg(META)),
    (2, "spec", F::Msg(&[(1, "finalizers", F::RepStr)])),
];
const CONFIGMAP: Schema = &[
    (1, "metadata", F::Msg(META)),
    (2, "data", F::MapStrStr),
    (3, "binaryData", F::MapStrBytes),
    (4, "immutable", F::Bool),
];
const SECRET: Schema = &[
    (1, "metadata", F::Msg(META)),
    (2, "data", F::MapStrBytes),
    (3, "type", F::Str),
    (4, "stringData", F::MapStrStr),
    (5, "immutable", F::Bool),
];
const SERVICEACCOUNT: Schema = &[
    (1, "metadata", F::Msg(META)),
    (2, "secrets", F::RepMsg(OBJECT_REF)),
    (3, "imagePullSecrets", F::RepMsg(NAME_REF)),
    (4, "automountServiceAccountToken", F::Bool),
];
const POLICY_RULE: Schema = &[
    (1, "verbs", F::RepStr),
    (2, "apiGroups", F::RepStr),
    (3, "resources", F::RepStr),
    (4, "resourceNames", F::RepStr),
    (5, "nonResourceURLs", F::RepStr),
];
const ROLE: Schema = &[
    (1, "metadata", F::Msg(META)),
    (2, "rules", F::RepMsg(POLICY_RULE)),
];
const BINDING: Schema = &[
    (1, "metadata", F::Msg(META)),
    (
        2,
        "subjects",
        F::RepMsg(&[
            (1, "kind", F::Str),
            (2, "apiGroup", F::Str),
            (3, "name", F::Str),
            (4, "namespace", F::Str),
        ]),
    ),
    (
        3,
        "roleRef",
        F::Msg(&[
            (1, "apiGroup", F::Str),
            (2, "kind", F::Str),
            (3, "name", F::Str),
        ]),
    ),
];
const RESOURCE_ATTRS: Schema = &[
    (1, "namespace", F::Str),
    (2, "verb", F::Str),
    (3, "group", F::Str),
    (4, "version", F::Str),
    (5, "resource", F::Str),
    (6, "subresource", F::Str),
    (7, "name", F::Str),
];
const NON_RESOURCE_ATTRS: Schema = &[(1, "path", F::Str), (2, "verb", F::Str)];
const SAR: Schema = &[
    (1, "metadata", F::Msg(META)),
    (
        2,
        "spec",
        F::Msg(&[
            (1, "resourceAttributes", F::Msg(RESOURCE_ATTRS)),
            (2, "nonResourceAttributes", F::Msg(NON_RESOURCE_ATTRS)),
            (3, "user", F::Str),
            (4, "groups", F::RepStr),
            (6, "uid", F::Str),
        ]),
    ),
];
const SELF_SAR: Schema = &[
    (1, "metadata", F::Msg(META)),
    (
        2,
        "spec",
        F::Msg(&[
            (1, "resourceAttributes", F::Msg(RESOURCE_ATTRS)),
            (2, "nonResourceAttributes", F::Msg(NON_RESOURCE_ATTRS)),
        ]),
    ),
];
const TOKEN_REVIEW: Schema = &[
    (1, "metadata", F::Msg(META)),
    (
        2,
        "spec",
        F::Msg(&[(1, "token", F::Str), (2, "audiences", F::RepStr)]),
    ),
];

fn schema_for(kind: &str) -> Option<Schema> {
    Some(match kind {
        "Namespace" => NAMESPACE,
        "ConfigMap" => CONFIGMAP,
        "Secret" => SECRET,
        "ServiceAccount" => SERVICEACCOUNT,
        "Role" | "ClusterRole" => ROLE,
        "RoleBinding" | "ClusterRoleBinding" => BINDING,
        "SubjectAccessReview" => SAR,
        "SelfSubjectAccessReview" => SELF_SAR,
        "TokenReview" => TOKEN_REVIEW,
        _ => return None,
    })
}

struct Reader<'a> {
    buf: &'a [u8],
}

enum Wire<'a> {
    Varint(u64),
    Len(&'a [u8]),
    Fixed,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, ProtoError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self
                .buf
                .split_first()
                .ok_or(ProtoError::Malformed("truncated varint"))?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ProtoError::Malformed("varint too long"))
    }

    fn field(&mut self) -> Result<Option<(u32, Wire<'a>)>, ProtoError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let num = u32::try_from(key >> 3).map_err(|_| ProtoError::Malformed("field number"))?;
        let wire = match key & 7 {
            0 => Wire::Varint(self.varint()?),
            2 => {
                let n =
                    usize::try_from(self.varint()?).map_err(|_| ProtoError::Malformed("length"))?;
                if n > self.buf.len() {
                    return Err(ProtoError::Malformed("length beyond the body"));
                }
                let (data, rest) = self.buf.split_at(n);
                self.buf = rest;
                Wire::Len(data)
            }
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                if n > self.buf.len() {
                    return Err(ProtoError::Malformed("truncated fixed field"));
                }
                self.buf = &self.buf[n..];
                Wire::Fixed
            }
            _ => return Err(ProtoError::Malformed("unsupported wire type")),
        };
        Ok(Some((num, wire)))
    }
}

fn text(b: &[u8]) -> Value {
    Value::String(String::from_utf8_lossy(b).into_owned())
}

fn map_entry(b: &[u8], bytes_value: bool) -> Result<(String, Value), ProtoError> {
    let mut r = Reader { buf: b };
    let (mut k, mut v) = (String::new(), Value::String(String::new()));
    while let Some((num, w)) = r.field()? {
        if let Wire::Len(d) = w {
            match num {
                1 => k = String::from_utf8_lossy(d).into_owned(),
                2 if bytes_value => {
                    use base64::Engine;
                    v = Value::String(base64::engine::general_purpose::STANDARD.encode(d));
                }
                2 => v = text(d),
                _ => {}
            }
        }
    }
    Ok((k, v))
}

fn message(b: &[u8], schema: Schema, depth: u32) -> Result<Value, ProtoError> {
    if depth > 16 {
        return Err(ProtoError::Malformed("nesting too deep"));
    }
    let mut out = Map::new();
    let mut r = Reader { buf: b };
    while let Some((num, w)) = r.field()? {
        let Some((_, name, f)) = schema.iter().find(|(n, _, _)| *n == num) else {
            continue;
        };
        let name = name.to_string();
        match (f, w) {
            (F::Str, Wire::Len(d)) => {
                out.insert(name, text(d));
            }
            (F::Int, Wire::Varint(v)) => {
                out.insert(name, Value::from(v as i64));
            }
            (F::Bool, Wire::Varint(v)) => {
                out.insert(name, Value::Bool(v != 0));
            }
            (F::Msg(s), Wire::Len(d)) => {
                out.insert(name, message(d, s, depth + 1)?);
            }
            (F::RepStr, Wire::Len(d)) => push(&mut out, name, text(d)),
            (F::RepMsg(s), Wire::Len(d)) => push(&mut out, name, message(d, s, depth + 1)?),
            (F::MapStrStr | F::MapStrBytes, Wire::Len(d)) => {
                let (k, v) = map_entry(d, matches!(f, F::MapStrBytes))?;
                let m = out.entry(name).or_insert_with(|| Value::Object(Map::new()));
                if let Some(m) = m.as_object_mut() {
                    m.insert(k, v);
                }
            }
            _ => return Err(ProtoError::Malformed("field has an unexpected wire type")),
        }
    }
    // Go's JSON encoding omits zero values; do the same so defaults apply as for JSON.
    out.retain(|_, v| match v {
        Value::String(s) => !s.is_empty(),
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_i64() != Some(0),
        _ => true,
    });
    Ok(Value::Object(out))
}

fn push(out: &mut Map<String, Value>, name: String, v: Value) {
    let slot = out.entry(name).or_insert_with(|| Value::Array(Vec::new()));
    if let Some(a) = slot.as_array_mut() {
        a.push(v);
    }
}

/// Decodes a `application/vnd.kubernetes.protobuf` body into the JSON object it encodes.
pub fn decode(body: &[u8]) -> Result<Value, ProtoError> {
    let rest = body
        .strip_prefix(b"k8s\0")
        .ok_or(ProtoError::Malformed("missing the k8s\\0 prefix"))?;
    let mut r = Reader { buf: rest };
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    while let Some((num, w)) = r.field()? {
        match (num, w) {
            (1, Wire::Len(tm)) => {
                let mut t = Reader { buf: tm };
                while let Some((n, w)) = t.field()? {
                    match (n, w) {
                        (1, Wire::Len(d)) => api_version = String::from_utf8_lossy(d).into_owned(),
                        (2, Wire::Len(d)) => kind = String::from_utf8_lossy(d).into_owned(),
                        _ => {}
                    }
                }
            }
            (2, Wire::Len(d)) => raw = d,
            _ => {}
        }
    }
    let schema = schema_for(&kind).ok_or_else(|| ProtoError::UnsupportedKind(kind.clone()))?;
    let mut obj = message(raw, schema, 0)?;
    obj["apiVersion"] = Value::String(api_version);
    obj["kind"] = Value::String(kind);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn len_field(num: u32, data: &[u8]) -> Vec<u8> {
        let mut out = vec![((num << 3) | 2) as u8, data.len() as u8];
        out.extend_from_slice(data);
        out
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut tm = len_field(1, api_version.as_bytes());
        tm.extend(len_field(2, kind.as_bytes()));
        let mut out = b"k8s\0".to_vec();
        out.extend(len_field(1, &tm));
        out.extend(len_field(2, raw));
        out
    }

    #[test]
    fn config_maps_decode_with_metadata_and_data() {
        let mut labels = len_field(1, b"app");
        labels.extend(len_field(2, b"web"));
        let mut meta = len_field(1, b"cm1");
        meta.extend(len_field(3, b""));
        meta.extend(len_field(11, &labels));
        let mut data = len_field(1, b"k");
        data.extend(len_field(2, b"v"));
        let mut raw = len_field(1, &meta);
        raw.extend(len_field(2, &data));
        raw.extend([4 << 3, 0]); // immutable: false
        let got = decode(&envelope("v1", "ConfigMap", &raw)).unwrap();
        assert_eq!(
            got,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm1", "labels": {"app": "web"}}, "data": {"k": "v"}})
        );
    }

    #[test]
    fn bad_bodies_are_errors_not_panics() {
        assert!(decode(b"{}").is_err());
        assert!(decode(b"k8s\0\x0a\xff").is_err());
        assert!(decode(b"k8s\0\x12\x05ab").is_err());
        assert_eq!(
            decode(&envelope("apps/v1", "Deployment", &[])),
            Err(ProtoError::UnsupportedKind("Deployment".into()))
        );
        for n in 0..64u8 {
            let _ = decode(&[b'k', b'8', b's', 0, n, n.wrapping_mul(7), 0xff, 0x80]);
        }
    }
}
