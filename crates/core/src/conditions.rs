//! Setting a Kubernetes condition in a status's list, the one way every controller does it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Sets `fresh` in `conditions`: it replaces the condition of its type, or is appended when
/// there is none. `lastTransitionTime` changes only with `status`: when the status is the
/// one already there, the old transition time is kept.
pub fn set_condition(conditions: &mut Vec<Condition>, fresh: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == fresh.type_) {
        Some(existing) => {
            let last_transition_time = if existing.status == fresh.status {
                existing.last_transition_time.clone()
            } else {
                fresh.last_transition_time.clone()
            };
            *existing = Condition {
                last_transition_time,
                ..fresh
            };
        }
        None => conditions.push(fresh),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::Timestamp;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn condition(type_: &str, status: &str, reason: &str, at: i64) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: reason.into(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::from_second(at).unwrap_or(Timestamp::UNIX_EPOCH)),
        }
    }

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let mut list = vec![condition("Ready", "True", "Up", 10)];
        set_condition(&mut list, condition("Ready", "True", "StillUp", 20));
        assert_eq!(
            list,
            vec![Condition {
                reason: "StillUp".into(),
                message: "StillUp".into(),
                ..condition("Ready", "True", "Up", 10)
            }]
        );
        set_condition(&mut list, condition("Ready", "False", "Down", 30));
        assert_eq!(list, vec![condition("Ready", "False", "Down", 30)]);
        set_condition(&mut list, condition("Other", "True", "New", 40));
        assert_eq!(list.len(), 2);
    }
}
