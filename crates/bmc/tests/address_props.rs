//! Property tests for the BMC address parser: it never panics, what it accepts it can print
//! back in a form that parses to the same address, and a password in an address never
//! reaches an error, whatever it contains.
#![allow(clippy::unwrap_used)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use hostcycle_bmc::address::{BmcAddress, BmcHost, SUPPORTED_SCHEMES, redact_userinfo};
use proptest::prelude::*;

fn scheme() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(SUPPORTED_SCHEMES).prop_map(str::to_string),
        proptest::sample::select(
            &[
                "redfish",
                "idrac-redfish",
                "ilo5-redfish",
                "redfish-virtualmedia"
            ][..]
        )
        .prop_flat_map(|base| {
            proptest::sample::select(&["+http", "+https"][..])
                .prop_map(move |t| format!("{base}{t}"))
        }),
    ]
}

fn host() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u32>().prop_map(|ip| Ipv4Addr::from(ip).to_string()),
        any::<u128>().prop_map(|ip| format!("[{}]", Ipv6Addr::from(ip))),
        // Letters-digits-hyphens names; `xn--` starts an IDNA A-label, which must hold valid
        // Punycode (a random tail is not), so those come from the list of real ones below.
        "[a-z][a-z0-9-]{0,10}[a-z0-9](\\.[a-z][a-z0-9]{0,8}){0,3}"
            .prop_filter("not an IDNA A-label", |name| !name.starts_with("xn--")),
        proptest::sample::select(&["xn--bcher-kva.example", "bmc.xn--mnchen-3ya.de"][..])
            .prop_map(str::to_string),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn never_panics_on_arbitrary_text(text in any::<String>()) {
        let _ = BmcAddress::parse(&text);
    }

    #[test]
    fn never_panics_on_address_like_text(
        text in "[a-zA-Z0-9+.-]{0,12}(://)?[\\[\\]a-zA-Z0-9:.@%/?#_-]{0,40}"
    ) {
        if let Ok(address) = BmcAddress::parse(&text) {
            // Whatever is accepted has a canonical form that parses to the same address.
            prop_assert_eq!(BmcAddress::parse(&address.to_string()).unwrap(), address);
        }
    }

    #[test]
    fn valid_addresses_parse_and_round_trip(
        scheme in scheme(),
        host in host(),
        port in proptest::option::of(1u16..),
        system in proptest::option::of("[A-Za-z0-9._-]{1,20}"),
    ) {
        // "." and ".." are dot segments that URL parsing resolves away, not System ids.
        prop_assume!(system.as_deref().is_none_or(|id| !id.trim_matches('.').is_empty()));
        let port_part = port.map(|p| format!(":{p}")).unwrap_or_default();
        let is_ipmi = scheme == "ipmi";
        let path = match (&system, is_ipmi) {
            (Some(id), false) => format!("/redfish/v1/Systems/{id}"),
            _ => String::new(),
        };
        let raw = format!("{scheme}://{host}{port_part}{path}");
        let address = BmcAddress::parse(&raw).unwrap();
        match &address {
            BmcAddress::Ipmi(ipmi) => {
                prop_assert!(is_ipmi);
                prop_assert_eq!(ipmi.port, port.unwrap_or(623));
            }
            BmcAddress::Redfish(redfish) => {
                prop_assert!(!is_ipmi);
                let default_port = if scheme.ends_with("+http") { 80 } else { 443 };
                prop_assert_eq!(redfish.base_url.port_or_known_default(), Some(port.unwrap_or(default_port)));
                prop_assert_eq!(redfish.system_path.as_deref(), (!path.is_empty()).then_some(path.as_str()));
            }
        }
        prop_assert_eq!(BmcAddress::parse(&address.to_string()).unwrap(), address);
    }

    #[test]
    fn bare_hosts_are_ipmi(ip in any::<IpAddr>(), port in proptest::option::of(1u16..)) {
        let host = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        };
        let raw = match port {
            Some(p) => format!("{host}:{p}"),
            None => host,
        };
        let BmcAddress::Ipmi(ipmi) = BmcAddress::parse(&raw).unwrap() else {
            return Err(TestCaseError::fail(format!("{raw} is not IPMI")));
        };
        prop_assert_eq!(ipmi.host, BmcHost::Ip(ip));
        prop_assert_eq!(ipmi.port, port.unwrap_or(623));
    }

    #[test]
    fn other_schemes_are_rejected_listing_the_supported_ones(
        scheme in "[a-z][a-z0-9+.-]{0,15}",
        rest in "[a-z0-9.]{1,20}",
    ) {
        prop_assume!(!SUPPORTED_SCHEMES.contains(&scheme.as_str()));
        prop_assume!(!scheme.ends_with("+http") && !scheme.ends_with("+https"));
        let err = BmcAddress::parse(&format!("{scheme}://{rest}")).unwrap_err();
        prop_assert!(err.to_string().contains("redfish+http"));
    }

    #[test]
    fn a_password_in_the_address_never_reaches_the_error(
        template in 0usize..ADDRESS_TEMPLATES.len(),
        password in password(),
    ) {
        let address = |password: &str| ADDRESS_TEMPLATES[template].replace("{pw}", password);
        let raw = address(&password);
        let err = BmcAddress::parse(&raw).unwrap_err();
        // Text that is in the error whatever the password (the template, the fixed wording)
        // proves nothing: compare with the error for a neutral password.
        let neutral = BmcAddress::parse(&address("X")).unwrap_err();
        let neutral_text = format!("{neutral} {neutral:?} {}", redact_userinfo(&address("X")));
        prop_assume!(!neutral_text.contains(&password));
        let texts = [
            err.to_string(),
            format!("{err:?}"),
            err.address.clone(),
            err.reason.clone(),
            redact_userinfo(&raw),
        ];
        for text in texts {
            prop_assert!(!text.contains(&password), "{raw:?} -> {text}");
        }
        prop_assert!(err.address.contains("<redacted>@"), "{}", err.address);
    }
}

/// Where people put credentials into an address; `{pw}` is the password.
const ADDRESS_TEMPLATES: &[&str] = &[
    "redfish://admin:{pw}@10.0.0.1/redfish/v1/Systems/1",
    "redfish+http://admin:{pw}@bmc.example.com:8000/redfish/v1/Systems/1",
    "idrac-redfish://root:{pw}@[fd00::5]/redfish/v1/Systems/System.Embedded.1",
    "redfish://:{pw}@10.0.0.1",
    "ipmi://admin:{pw}@10.0.0.1:623",
    "admin:{pw}@10.0.0.1",
    " redfish://admin:{pw}@10.0.0.1/redfish/v1/Systems/1 ",
];

/// Passwords heavy in what URLs treat specially, and anything at all.
fn password() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9/@:#?%&=+ !$'()*,;\\[\\]~._-]{1,24}",
        "[a-z]{2,8}(%[0-9A-F]{2}){1,4}[a-z]{0,4}",
        "[a-zA-Z0-9]{1,6}(://|/|#|\\?|@)[a-zA-Z0-9@/]{0,10}",
        any::<String>().prop_filter("non-empty", |p| !p.is_empty()),
    ]
}

/// An A-label with invalid Punycode is refused at parse time for every scheme, with the
/// same message (it used to pass for IPMI and fail only when the Redfish URL was built).
#[test]
fn invalid_punycode_host_names_are_refused_for_every_scheme() {
    for scheme in SUPPORTED_SCHEMES {
        for host in ["xn--0", "bmc.xn--0.example", "xn--a.b"] {
            let raw = format!("{scheme}://{host}");
            let err = BmcAddress::parse(&raw).unwrap_err();
            assert!(
                err.reason.contains("is not a valid host name"),
                "{raw}: {}",
                err.reason
            );
        }
    }
    let BmcAddress::Ipmi(ipmi) = BmcAddress::parse("ipmi://xn--bcher-kva.example").unwrap() else {
        panic!("an ipmi:// address is IPMI");
    };
    assert_eq!(ipmi.host, BmcHost::Name("xn--bcher-kva.example".into()));
}
