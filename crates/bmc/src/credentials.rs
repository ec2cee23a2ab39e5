//! BMC credentials from a Kubernetes Secret (`spec.bmc.credentialsName`, keys `username` and
//! `password`). The password never appears in `Debug`, `Display`, logs or errors.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use crate::destination::{ADDRESSES_ANNOTATION, MAX_ADDRESSES_ANNOTATION};

/// The key holding the user name in the credentials Secret.
pub const USERNAME_KEY: &str = "username";
/// The key holding the password in the credentials Secret.
pub const PASSWORD_KEY: &str = "password";
/// The longest user name read from a Secret, in bytes: BMC accounts are short (IPMI allows
/// 16, Redfish services a few dozen); anything longer is refused, not kept.
pub const MAX_USERNAME_BYTES: usize = 256;
/// The longest password read from a Secret, in bytes (IPMI allows 20; Redfish services
/// rarely more than 128).
pub const MAX_PASSWORD_BYTES: usize = 1024;

/// A BMC user name and password. `Debug` shows the user name only.
#[derive(Clone, PartialEq, Eq)]
pub struct BmcCredentials {
    username: String,
    password: String,
}

impl BmcCredentials {
    /// Trims surrounding whitespace (Secrets made with `echo` end in a newline). Both parts
    /// must be non-empty after trimming.
    pub fn new(
        username: impl AsRef<str>,
        password: impl AsRef<str>,
    ) -> Result<Self, CredentialsError> {
        let username = username.as_ref().trim();
        let password = password.as_ref().trim();
        if username.is_empty() {
            return Err(CredentialsError::Empty {
                key: USERNAME_KEY,
                secret: None,
            });
        }
        if password.is_empty() {
            return Err(CredentialsError::Empty {
                key: PASSWORD_KEY,
                secret: None,
            });
        }
        Ok(BmcCredentials {
            username: username.to_string(),
            password: password.to_string(),
        })
    }

    pub fn username(&self) -> &str {
        &self.username
    }

    /// The password, for the one place that sends it to the BMC.
    pub fn password(&self) -> &str {
        &self.password
    }
}

impl fmt::Debug for BmcCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BmcCredentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Why credentials could not be read. Meant for the host's status; never contains the
/// password (nor the user name).
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error(
        "BMC credentials Secret {namespace}/{name} not found; create it with keys \
         `username` and `password` (or fix spec.bmc.credentialsName)"
    )]
    SecretNotFound { namespace: String, name: String },

    #[error("BMC credentials Secret {secret} has no `{key}` key; add it", secret = .secret.as_deref().unwrap_or("(unnamed)"))]
    MissingKey {
        key: &'static str,
        secret: Option<String>,
    },

    #[error("the `{key}` of BMC credentials{} is empty; set a non-empty value", in_secret(.secret))]
    Empty {
        key: &'static str,
        secret: Option<String>,
    },

    #[error("the `{key}` of BMC credentials{} is not valid UTF-8", in_secret(.secret))]
    NotUtf8 {
        key: &'static str,
        secret: Option<String>,
    },

    #[error(
        "the `{key}` of BMC credentials{} is longer than the {max} bytes hostcycle reads; \
         shorten it",
        in_secret(.secret)
    )]
    TooLong {
        key: &'static str,
        secret: Option<String>,
        max: usize,
    },

    #[error("the BMC credentials Secret has no name (spec.bmc.credentialsName is empty)")]
    NoSecretName,

    #[error("could not read BMC credentials Secret {namespace}/{name}: {detail}")]
    Api {
        namespace: String,
        name: String,
        /// What the API call said (see [`api_detail`]).
        detail: String,
    },

    #[error("could not read the BMC password file {path}: {detail}")]
    PasswordFile { path: String, detail: String },
}

fn in_secret(secret: &Option<String>) -> String {
    secret
        .as_ref()
        .map(|s| format!(" Secret {s}"))
        .unwrap_or_default()
}

/// One value of a credentials Secret as stored: `data` (bytes) or `stringData` (text).
enum RawValue<'a> {
    Bytes(&'a [u8]),
    Text(&'a str),
}

/// The username and password from a Secret's values, trimmed, each non-empty, UTF-8 and
/// within its bound. `lookup` finds a key in `data`, else in `stringData`.
fn credentials_from_values<'a>(
    secret: Option<String>,
    lookup: impl Fn(&'static str) -> Option<RawValue<'a>>,
) -> Result<BmcCredentials, CredentialsError> {
    let value = |key: &'static str, max: usize| -> Result<String, CredentialsError> {
        let text = match lookup(key) {
            Some(RawValue::Bytes(bytes)) => {
                std::str::from_utf8(bytes).map_err(|_| CredentialsError::NotUtf8 {
                    key,
                    secret: secret.clone(),
                })?
            }
            Some(RawValue::Text(text)) => text,
            None => {
                return Err(CredentialsError::MissingKey {
                    key,
                    secret: secret.clone(),
                });
            }
        };
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(CredentialsError::Empty {
                key,
                secret: secret.clone(),
            });
        }
        if trimmed.len() > max {
            return Err(CredentialsError::TooLong {
                key,
                secret: secret.clone(),
                max,
            });
        }
        Ok(trimmed.to_string())
    };
    let username = value(USERNAME_KEY, MAX_USERNAME_BYTES)?;
    let password = value(PASSWORD_KEY, MAX_PASSWORD_BYTES)?;
    Ok(BmcCredentials { username, password })
}

fn secret_label(namespace: Option<&str>, name: Option<&str>) -> Option<String> {
    match (namespace, name) {
        (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
        (None, Some(name)) => Some(name.to_string()),
        _ => None,
    }
}

/// Reads credentials from a Secret's `data` (or, for Secrets built in code, `stringData`).
pub fn credentials_from_secret(secret: &Secret) -> Result<BmcCredentials, CredentialsError> {
    let name = secret_label(
        secret.metadata.namespace.as_deref(),
        secret.metadata.name.as_deref(),
    );
    credentials_from_values(name, |key| {
        if let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(key)) {
            Some(RawValue::Bytes(&bytes.0))
        } else {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|t| RawValue::Text(t))
        }
    })
}

/// What hostcycle keeps of a BMC credentials Secret: its identity, its credentials (or why
/// they cannot be used), whether it carries the label the operator requires, and its
/// [`ADDRESSES_ANNOTATION`]. Nothing else of the Secret is kept, nor even built: other keys
/// of `data`/`stringData` and other annotations are skipped as the API server's answer is
/// parsed, and the labels are read for the one label asked about and dropped.
#[derive(Debug)]
pub struct CredentialsSecret {
    pub namespace: String,
    pub name: String,
    pub resource_version: Option<String>,
    pub credentials: Result<BmcCredentials, CredentialsError>,
    /// Whether the Secret carries the label asked for (`true` when none was).
    pub labelled: bool,
    pub addresses: AddressesAnnotation,
}

/// A Secret's [`ADDRESSES_ANNOTATION`], bounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressesAnnotation {
    Absent,
    Listed(String),
    /// Longer than [`MAX_ADDRESSES_ANNOTATION`] bytes: not kept, and refused.
    TooLong,
}

impl AddressesAnnotation {
    fn bounded(value: Option<String>) -> Self {
        match value {
            None => AddressesAnnotation::Absent,
            Some(v) if v.len() > MAX_ADDRESSES_ANNOTATION => AddressesAnnotation::TooLong,
            Some(v) => AddressesAnnotation::Listed(v),
        }
    }
}

/// Which keys of a map [`KeptMap`] keeps.
trait KeptKeys {
    const KEYS: &'static [&'static str];
}

/// `data` and `stringData`: the BMC's keys.
struct CredentialKeys;
impl KeptKeys for CredentialKeys {
    const KEYS: &'static [&'static str] = &[USERNAME_KEY, PASSWORD_KEY];
}

/// `metadata.annotations`: the one hostcycle reads.
struct AddressesKey;
impl KeptKeys for AddressesKey {
    const KEYS: &'static [&'static str] = &[ADDRESSES_ANNOTATION];
}

/// A JSON object of which only the entries of `K::KEYS` are built; every other value is
/// skipped by the parser (never allocated) and every other key compared and dropped.
struct KeptMap<K, V> {
    entries: Vec<(&'static str, V)>,
    keys: PhantomData<K>,
}

impl<K, V> KeptMap<K, V> {
    fn get(&self, key: &str) -> Option<&V> {
        self.entries.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }
}

impl<'de, K: KeptKeys, V: Deserialize<'de>> Deserialize<'de> for KeptMap<K, V> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<K, V>(PhantomData<(K, V)>);
        impl<'de, K: KeptKeys, V: Deserialize<'de>> Visitor<'de> for MapVisitor<K, V> {
            type Value = KeptMap<K, V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key_seed(KeptKey::<K>(PhantomData))? {
                    match key {
                        Some(key) => entries.push((key, map.next_value::<V>()?)),
                        None => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(KeptMap {
                    entries,
                    keys: PhantomData,
                })
            }
        }
        deserializer.deserialize_map(MapVisitor(PhantomData))
    }
}

/// A map key: which of `K::KEYS` it is, if any (the key itself is not kept).
struct KeptKey<K>(PhantomData<K>);

impl<'de, K: KeptKeys> DeserializeSeed<'de> for KeptKey<K> {
    type Value = Option<&'static str>;
    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de, K: KeptKeys> Visitor<'de> for KeptKey<K> {
    type Value = Option<&'static str>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string key")
    }
    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(K::KEYS.iter().copied().find(|k| *k == key))
    }
}

/// The API server's answer, read for the parts [`CredentialsSecret`] keeps.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireSecret {
    #[serde(default)]
    metadata: WireMetadata,
    #[serde(default)]
    data: Option<KeptMap<CredentialKeys, ByteString>>,
    #[serde(default)]
    string_data: Option<KeptMap<CredentialKeys, String>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct WireMetadata {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    // Label values are at most 63 bytes (the API server checks); the map lives for one parse.
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    annotations: Option<KeptMap<AddressesKey, String>>,
}

impl WireSecret {
    fn keep(self, namespace: &str, name: &str, label: Option<(&str, &str)>) -> CredentialsSecret {
        let WireSecret {
            metadata,
            data,
            string_data,
        } = self;
        let credentials = credentials_from_values(Some(format!("{namespace}/{name}")), |key| {
            if let Some(bytes) = data.as_ref().and_then(|d| d.get(key)) {
                Some(RawValue::Bytes(&bytes.0))
            } else {
                string_data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|t| RawValue::Text(t))
            }
        });
        let labelled = label.is_none_or(|(key, value)| {
            metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(key))
                .is_some_and(|v| v == value)
        });
        let addresses = AddressesAnnotation::bounded(
            metadata
                .annotations
                .and_then(|mut a| a.entries.pop().map(|(_, v)| v)),
        );
        CredentialsSecret {
            namespace: metadata.namespace.unwrap_or_else(|| namespace.to_string()),
            name: metadata.name.unwrap_or_else(|| name.to_string()),
            resource_version: metadata.resource_version,
            credentials,
            labelled,
            addresses,
        }
    }
}

/// Parses an API server's answer for a Secret into what hostcycle keeps of it.
pub fn credentials_secret_from_json(
    json: &str,
    namespace: &str,
    name: &str,
    label: Option<(&str, &str)>,
) -> Result<CredentialsSecret, serde_json::Error> {
    Ok(serde_json::from_str::<WireSecret>(json)?.keep(namespace, name, label))
}

/// GETs the Secret `namespace/name` and keeps only what [`CredentialsSecret`] holds; `None`
/// when the API server has no such Secret. `label`: the `KEY=VALUE` the operator requires
/// (`--bmc-credentials-label`), for [`CredentialsSecret::labelled`]. An error is the API
/// call's; describe a `SerdeError` without its message (it may quote the Secret's data).
pub async fn read_credentials_secret(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    label: Option<(&str, &str)>,
) -> Result<Option<CredentialsSecret>, kube::Error> {
    let request = kube::core::Request::new(format!("/api/v1/namespaces/{namespace}/secrets"))
        .get(name, &kube::api::GetParams::default())
        .map_err(kube::Error::BuildRequest)?;
    match client.request::<WireSecret>(request).await {
        Ok(wire) => Ok(Some(wire.keep(namespace, name, label))),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// Loads credentials from the Secret `name` in `namespace`.
pub async fn load_credentials(
    client: kube::Client,
    namespace: &str,
    name: &str,
) -> Result<BmcCredentials, CredentialsError> {
    if name.trim().is_empty() {
        return Err(CredentialsError::NoSecretName);
    }
    let secret = read_credentials_secret(&client, namespace, name, None)
        .await
        .map_err(|e| CredentialsError::Api {
            namespace: namespace.to_string(),
            name: name.to_string(),
            detail: api_detail(&e),
        })?;
    match secret {
        Some(secret) => secret.credentials,
        None => Err(CredentialsError::SecretNotFound {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }),
    }
}

/// A failed Secret read in words. An answer that could not be deserialized is described
/// without the parser's message: that quotes bytes of the answer and where they are (a piece
/// of a value, the position of keys).
fn api_detail(error: &kube::Error) -> String {
    match error {
        kube::Error::SerdeError(_) => "the API server's answer could not be read as a Secret \
             (the parser's details are withheld: they may quote the Secret's data); check the \
             API server and any proxy in front of it"
            .to_string(),
        other => other.to_string(),
    }
}

/// Reads a password from a file, trimmed (for the CLI).
pub fn password_from_file(path: &std::path::Path) -> Result<String, CredentialsError> {
    let text = std::fs::read(path).map_err(|e| CredentialsError::PasswordFile {
        path: path.display().to_string(),
        detail: e.to_string(),
    })?;
    let text = String::from_utf8(text).map_err(|_| CredentialsError::PasswordFile {
        path: path.display().to_string(),
        detail: "not valid UTF-8".into(),
    })?;
    Ok(text.trim().to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeMap;

    use k8s_openapi::ByteString;
    use kube::api::ObjectMeta;

    use super::*;

    fn secret(data: &[(&str, &[u8])]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("bmc-creds".into()),
                namespace: Some("hosts".into()),
                ..Default::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn reads_and_trims_both_keys() {
        let creds = credentials_from_secret(&secret(&[
            ("username", b" admin\n"),
            ("password", b"hunter2\n"),
        ]))
        .unwrap();
        assert_eq!(creds.username(), "admin");
        assert_eq!(creds.password(), "hunter2");
    }

    #[test]
    fn string_data_is_accepted() {
        let s = Secret {
            string_data: Some(BTreeMap::from([
                ("username".to_string(), "root".to_string()),
                ("password".to_string(), "calvin".to_string()),
            ])),
            ..Default::default()
        };
        assert_eq!(credentials_from_secret(&s).unwrap().username(), "root");
    }

    #[test]
    fn missing_key_names_the_key_and_the_secret() {
        let err = credentials_from_secret(&secret(&[("username", b"admin")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "BMC credentials Secret hosts/bmc-creds has no `password` key; add it"
        );
        let err = credentials_from_secret(&Secret::default()).unwrap_err();
        assert!(matches!(
            err,
            CredentialsError::MissingKey {
                key: "username",
                ..
            }
        ));
    }

    #[test]
    fn empty_or_whitespace_values_are_rejected() {
        let err = credentials_from_secret(&secret(&[("username", b"admin"), ("password", b" \n")]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the `password` of BMC credentials Secret hosts/bmc-creds is empty; set a non-empty value"
        );
        assert!(BmcCredentials::new("", "x").is_err());
        assert!(BmcCredentials::new("u", "   ").is_err());
    }

    #[test]
    fn invalid_utf8_is_an_error_not_a_panic() {
        let err =
            credentials_from_secret(&secret(&[("username", b"\xff\xfe"), ("password", b"p")]))
                .unwrap_err();
        assert!(matches!(
            err,
            CredentialsError::NotUtf8 {
                key: "username",
                ..
            }
        ));
    }

    #[test]
    fn debug_output_redacts_the_password() {
        let creds = BmcCredentials::new("admin", "hunter2-very-secret").unwrap();
        let debug = format!("{creds:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert_eq!(
            debug,
            r#"BmcCredentials { username: "admin", password: "<redacted>" }"#
        );
        let pretty = format!("{creds:#?}");
        assert!(!pretty.contains("hunter2"), "{pretty}");
    }

    #[test]
    fn errors_never_contain_the_values() {
        let s = secret(&[("username", b"admin-user"), ("password", b"")]);
        let err = credentials_from_secret(&s).unwrap_err();
        let text = format!("{err} {err:?}");
        assert!(!text.contains("admin-user"), "{text}");
    }

    /// Someone who may read a host but not its Secret learns from the host's status which
    /// required key is missing or unusable — never which other keys the Secret has, how long
    /// any value is, or a piece of one. Each case is a Secret with decoy keys beside (or
    /// instead of) the required ones.
    #[test]
    fn messages_name_only_the_required_key() {
        const DECOY_KEYS: [&str; 4] = ["Password", "login", "ssh-privatekey", "bmc-token"];
        const DECOY_VALUES: [&[u8]; 4] = [
            b"dcy-Qz7x-Pw-Kr2m",
            b"dcy-Rt9v-Lq",
            b"MIIEvQIBADANBgkq",
            b"dcy-Tk3j-Wn8b",
        ];
        let decoys = || DECOY_KEYS.iter().copied().zip(DECOY_VALUES.iter().copied());
        let with = |extra: &[(&'static str, &'static [u8])]| {
            let mut data: Vec<(&str, &[u8])> = decoys().collect();
            data.extend_from_slice(extra);
            secret(&data)
        };
        let username: &[u8] = b"adm-Xq4z";
        let password: &[u8] = b"Hj8-Zv2q-Kc5w";
        let cases: Vec<(Secret, &str)> = vec![
            (with(&[]), "username"),
            (with(&[("username", username)]), "password"),
            (with(&[("password", password)]), "username"),
            (
                with(&[("username", b"  \n"), ("password", password)]),
                "username",
            ),
            (
                with(&[("username", username), ("password", b"\t")]),
                "password",
            ),
            (
                with(&[("username", b"adm-\xffXq4z"), ("password", password)]),
                "username",
            ),
            (
                with(&[("username", username), ("password", b"Hj8-\xfeZv2q")]),
                "password",
            ),
            // Decoys only in stringData.
            (
                Secret {
                    metadata: secret(&[]).metadata,
                    string_data: Some(
                        decoys()
                            .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v).into()))
                            .chain([("username".to_string(), "adm-Xq4z".to_string())])
                            .collect(),
                    ),
                    ..Default::default()
                },
                "password",
            ),
        ];
        for (secret, key) in cases {
            let err = credentials_from_secret(&secret).unwrap_err();
            let text = format!("{err} | {err:?}");
            assert!(text.contains(&format!("`{key}`")), "names `{key}`: {text}");
            assert!(text.contains("hosts/bmc-creds"), "names the Secret: {text}");
            for decoy in DECOY_KEYS {
                assert!(!text.contains(decoy), "reveals key {decoy}: {text}");
            }
            // No piece of any value (4 bytes is the shortest run that could identify one).
            for value in DECOY_VALUES.into_iter().chain([username, password]) {
                for piece in value.windows(4) {
                    let piece = String::from_utf8_lossy(piece);
                    assert!(!text.contains(piece.as_ref()), "reveals {piece:?}: {text}");
                }
            }
            // No size: the messages hold no number (but the one in "UTF-8").
            let message = err.to_string().replace("UTF-8", "");
            assert!(
                !message.chars().any(|c| c.is_ascii_digit()),
                "a number in: {message}"
            );
        }
    }

    #[test]
    fn an_unreadable_secret_is_described_without_the_parsers_message() {
        let parsed = serde_json::from_str::<Secret>(r#"{"data": {"password": "Hj8-Zv2q!Kc5w"}}"#);
        let err = CredentialsError::Api {
            namespace: "hosts".into(),
            name: "bmc-creds".into(),
            detail: api_detail(&kube::Error::SerdeError(parsed.unwrap_err())),
        };
        let text = format!("{err} | {err:?}");
        assert!(
            text.starts_with("could not read BMC credentials Secret hosts/bmc-creds: the API"),
            "{text}"
        );
        for detail in ["symbol", "offset", "column", "Zv2q"] {
            assert!(!text.contains(detail), "{detail:?} in: {text}");
        }
    }

    /// What is kept of a Secret read from the API server: the two credentials, the label's
    /// verdict, the addresses annotation and the identity — no other key, value, label or
    /// annotation, however large.
    #[test]
    fn only_the_keys_used_are_kept_from_a_secret() {
        let huge = "Qz7x".repeat(64 * 1024);
        let json = serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {
                "name": "bmc-creds", "namespace": "hosts", "resourceVersion": "42",
                "uid": "u-1",
                "labels": { "hostcycle.io/bmc-credentials": "true", "team": "dcy-Lq7v" },
                "annotations": {
                    "hostcycle.io/bmc-addresses": "10.0.0.5",
                    "note": huge,
                },
                "managedFields": [{ "manager": "kubectl", "fieldsV1": { "f:data": {} } }],
            },
            "data": {
                "username": "YWRtaW4K",
                "password": "aHVudGVyMg==",
                "ssh-privatekey": base64_of(&huge),
            },
            "stringData": { "token": huge },
        })
        .to_string();
        let kept = credentials_secret_from_json(
            &json,
            "hosts",
            "bmc-creds",
            Some(("hostcycle.io/bmc-credentials", "true")),
        )
        .unwrap();
        assert_eq!(
            (kept.namespace.as_str(), kept.name.as_str()),
            ("hosts", "bmc-creds")
        );
        assert_eq!(kept.resource_version.as_deref(), Some("42"));
        assert!(kept.labelled);
        assert_eq!(
            kept.addresses,
            AddressesAnnotation::Listed("10.0.0.5".into())
        );
        let creds = kept.credentials.as_ref().unwrap();
        assert_eq!((creds.username(), creds.password()), ("admin", "hunter2"));
        let debug = format!("{kept:?}");
        assert!(debug.len() < 400, "{debug}");
        for gone in [
            "Qz7x", "dcy-Lq7v", "team", "note", "kubectl", "u-1", "hunter2",
        ] {
            assert!(!debug.contains(gone), "{gone} kept: {debug}");
        }

        let unlabelled =
            credentials_secret_from_json(&json, "hosts", "bmc-creds", Some(("other", "x")))
                .unwrap();
        assert!(!unlabelled.labelled);
        assert!(
            credentials_secret_from_json(&json, "hosts", "bmc-creds", None)
                .unwrap()
                .labelled,
            "no label asked for"
        );
    }

    fn base64_of(text: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(text)
    }

    #[test]
    fn over_long_values_are_refused_not_kept() {
        let secret_json = |username: &str, password: &str, addresses: &str| {
            serde_json::json!({
                "metadata": {
                    "name": "c", "namespace": "n",
                    "annotations": { "hostcycle.io/bmc-addresses": addresses },
                },
                "stringData": { "username": username, "password": password },
            })
            .to_string()
        };
        let read = |json: &str| credentials_secret_from_json(json, "n", "c", None).unwrap();
        let max_user = "u".repeat(MAX_USERNAME_BYTES);
        let max_password = "p".repeat(MAX_PASSWORD_BYTES);
        let at_limit = read(&secret_json(&max_user, &max_password, "10.0.0.5"));
        assert!(at_limit.credentials.is_ok());

        let long_password = read(&secret_json("admin", &"Hj8-".repeat(300), "10.0.0.5"));
        let err = long_password.credentials.unwrap_err();
        assert!(
            matches!(
                err,
                CredentialsError::TooLong {
                    key: "password",
                    max: MAX_PASSWORD_BYTES,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(!err.to_string().contains("Hj8-"), "{err}");
        let long_user = read(&secret_json(&"a".repeat(MAX_USERNAME_BYTES + 1), "p", ""));
        assert!(matches!(
            long_user.credentials,
            Err(CredentialsError::TooLong {
                key: "username",
                ..
            })
        ));

        let long_list = "10.0.0.5,".repeat(MAX_ADDRESSES_ANNOTATION / 9 + 1);
        assert_eq!(
            read(&secret_json("admin", "p", &long_list)).addresses,
            AddressesAnnotation::TooLong
        );
        let none = read(r#"{"metadata": {}, "data": {}}"#);
        assert_eq!(none.addresses, AddressesAnnotation::Absent);
        assert!(matches!(
            none.credentials,
            Err(CredentialsError::MissingKey {
                key: "username",
                ..
            })
        ));
    }

    #[test]
    fn password_file_is_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "s3cret\n").unwrap();
        assert_eq!(password_from_file(&path).unwrap(), "s3cret");
        let err = password_from_file(&dir.path().join("missing")).unwrap_err();
        assert!(
            err.to_string()
                .contains("could not read the BMC password file"),
            "{err}"
        );
    }
}
