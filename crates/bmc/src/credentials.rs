//! BMC credentials from a Kubernetes Secret (`spec.bmc.credentialsName`, keys `username` and
//! `password`). The password never appears in `Debug`, `Display`, logs or errors.

use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

/// The key holding the user name in the credentials Secret.
pub const USERNAME_KEY: &str = "username";
/// The key holding the password in the credentials Secret.
pub const PASSWORD_KEY: &str = "password";

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

/// Reads credentials from a Secret's `data` (or, for Secrets built in code, `stringData`).
pub fn credentials_from_secret(secret: &Secret) -> Result<BmcCredentials, CredentialsError> {
    let name = match (&secret.metadata.namespace, &secret.metadata.name) {
        (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
        (None, Some(name)) => Some(name.clone()),
        _ => None,
    };
    let value = |key: &'static str| -> Result<String, CredentialsError> {
        let raw = if let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(key)) {
            String::from_utf8(bytes.0.clone()).map_err(|_| CredentialsError::NotUtf8 {
                key,
                secret: name.clone(),
            })?
        } else if let Some(text) = secret.string_data.as_ref().and_then(|d| d.get(key)) {
            text.clone()
        } else {
            return Err(CredentialsError::MissingKey {
                key,
                secret: name.clone(),
            });
        };
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            return Err(CredentialsError::Empty {
                key,
                secret: name.clone(),
            });
        }
        Ok(trimmed.to_string())
    };
    let username = value(USERNAME_KEY)?;
    let password = value(PASSWORD_KEY)?;
    Ok(BmcCredentials { username, password })
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
    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    let secret = secrets
        .get_opt(name)
        .await
        .map_err(|e| CredentialsError::Api {
            namespace: namespace.to_string(),
            name: name.to_string(),
            detail: api_detail(&e),
        })?;
    match secret {
        Some(secret) => credentials_from_secret(&secret),
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
