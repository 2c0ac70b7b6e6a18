//! Upstream's leader election on a `kube-system` Lease (client-go's `tryAcquireOrRenew`) for
//! the standalone scheduler and controller manager. A Lease is judged expired by when this
//! process last saw its record change, on its own monotonic clock — never by comparing the
//! holder's `renewTime` with this machine's wall clock, so replicas whose clocks disagree (or
//! jump) never both believe they lead.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use crate::placement::{LEASE_NAMESPACE, conflict_is_loss, new_lease};

/// The parts of a Lease's spec whose change shows its holder is alive (upstream's
/// `LeaderElectionRecord`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    holder: String,
    duration_seconds: i32,
    acquired: Option<String>,
    renewed: Option<String>,
    transitions: i32,
}

impl Record {
    fn of(spec: &LeaseSpec) -> Record {
        Record {
            holder: spec.holder_identity.clone().unwrap_or_default(),
            duration_seconds: spec.lease_duration_seconds.unwrap_or(0),
            acquired: spec.acquire_time.as_ref().map(|t| t.0.to_string()),
            renewed: spec.renew_time.as_ref().map(|t| t.0.to_string()),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }
}

/// One candidate for one Lease.
pub struct LeaderElection {
    name: String,
    identity: String,
    lease_duration: Duration,
    /// The record last seen and when (this process's clock) it was first seen so.
    observed: Option<(Record, Instant)>,
}

impl LeaderElection {
    pub fn new(name: &str, identity: &str, lease_duration: Duration) -> LeaderElection {
        LeaderElection {
            name: name.to_string(),
            identity: identity.to_string(),
            lease_duration,
            observed: None,
        }
    }

    /// Notes the record read at `now`; `true` when another holder's claim is still valid —
    /// its record changed less than its duration ago, as this process saw it.
    fn held_by_another(&mut self, record: Record, now: Instant) -> bool {
        match &self.observed {
            Some((seen, _)) if *seen == record => {}
            _ => self.observed = Some((record, now)),
        }
        let Some((record, since)) = &self.observed else {
            return false;
        };
        let valid_for = Duration::from_secs(u64::try_from(record.duration_seconds).unwrap_or(0));
        !record.holder.is_empty() && record.holder != self.identity && now < *since + valid_for
    }

    /// Takes or renews the Lease: `true` when held.
    pub async fn try_acquire_or_renew(
        &mut self,
        client: &kube::Client,
    ) -> Result<bool, kube::Error> {
        let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let duration_seconds = i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = leases.get_opt(&self.name).await? else {
            let lease = new_lease(&self.name, &self.identity, duration_seconds, now);
            return self.written(leases.create(&PostParams::default(), &lease).await);
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if self.held_by_another(Record::of(spec), Instant::now()) {
            return Ok(false);
        }
        if spec.holder_identity.as_deref() != Some(&self.identity) {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.lease_duration_seconds = Some(duration_seconds);
        spec.renew_time = Some(now);
        // The replace carries the resourceVersion read: a candidate that wrote in between wins.
        self.written(
            leases
                .replace(&self.name, &PostParams::default(), &lease)
                .await,
        )
    }

    /// What a create or replace of the Lease means; the record written is the one observed.
    fn written(&mut self, outcome: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
        if let Ok(lease) = &outcome
            && let Some(spec) = &lease.spec
        {
            self.observed = Some((Record::of(spec), Instant::now()));
        }
        conflict_is_loss(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: &str, renewed: &str) -> Record {
        Record {
            holder: holder.into(),
            duration_seconds: 15,
            acquired: None,
            renewed: Some(renewed.into()),
            transitions: 0,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn another_holder_is_waited_out_by_this_processs_clock_not_its_renew_time() {
        let mut election = LeaderElection::new("kube-scheduler", "b", Duration::from_secs(15));
        // A renewTime far in the past (the holder's clock is behind, or ours jumped ahead)
        // does not make the Lease free: it was first seen just now.
        assert!(election.held_by_another(record("a", "2001-01-01T00:00:00Z"), Instant::now()));
        tokio::time::advance(Duration::from_secs(14)).await;
        assert!(election.held_by_another(record("a", "2001-01-01T00:00:00Z"), Instant::now()));
        // A renewal seen restarts the wait.
        assert!(election.held_by_another(record("a", "2001-01-01T00:00:02Z"), Instant::now()));
        tokio::time::advance(Duration::from_secs(14)).await;
        assert!(election.held_by_another(record("a", "2001-01-01T00:00:02Z"), Instant::now()));
        // Unchanged for the whole duration: free, whatever its renewTime says.
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(!election.held_by_another(record("a", "2001-01-01T00:00:02Z"), Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn its_own_and_a_released_lease_are_free() {
        let mut election = LeaderElection::new("kube-scheduler", "b", Duration::from_secs(15));
        assert!(!election.held_by_another(record("b", "2099-01-01T00:00:00Z"), Instant::now()));
        assert!(!election.held_by_another(record("", "2099-01-01T00:00:00Z"), Instant::now()));
    }
}
