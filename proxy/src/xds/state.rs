//! What the sidecar does with pushed resources, free of IO: given the responses that arrived
//! together, decide each one's verdict (ACK/NACK) and which config to apply. The validator is
//! passed in (`Shared::apply` in production), so the rules are unit-tested without sockets.
//!
//! State-of-the-World versions each type on its own, but a config change often spans types
//! (a new cluster, its endpoints and the route that uses it). The server pushes all types of
//! a revision back to back, so the IO loop hands them over as one batch, and the batch is
//! first applied as a whole: one swap, no intermediate config that would be invalid or route
//! to half of a change. If that fails, the batch less one type is tried for each type (so
//! types that only work together still pass beside a bad one), then the types one at a time
//! (repeatedly, so any order that works is found). A type that still fails is taken apart:
//! each resource it adds, changes or removes is tried on its own (again until no progress),
//! so one bad service never keeps a new good one from being served; the response is NACKed
//! naming the refused resources, which keep their last good version (or stay absent). Of two
//! responses of one type in a batch only the later counts.

use weft_xds::subscription::Verdict;
use weft_xds::transport::DiscoveryResponse;

use super::convert::Dynamic;
use crate::config::Config;

/// The bootstrap plus the resources accepted so far (what is being served).
#[derive(Debug, Clone)]
pub struct State {
    bootstrap: Config,
    accepted: Dynamic,
}

/// The result of one batch.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    /// One per response, in batch order.
    pub verdicts: Vec<Verdict>,
    /// The version of the last config applied, if the batch changed what is served.
    pub applied: Option<u64>,
}

impl State {
    pub fn new(bootstrap: Config) -> State {
        State { bootstrap, accepted: Dynamic::default() }
    }

    /// What the control plane delivered and the sidecar accepted (what the disk cache saves).
    pub fn accepted(&self) -> &Dynamic {
        &self.accepted
    }

    /// Serves `saved` (e.g. the disk cache) if `apply` accepts it; the state is unchanged if not.
    pub fn restore(
        &mut self,
        saved: Dynamic,
        apply: impl FnOnce(Config) -> Result<u64, String>,
    ) -> Result<u64, String> {
        let v = apply(saved.merge(&self.bootstrap))?;
        self.accepted = saved;
        Ok(v)
    }

    /// Decides a batch of responses; see the module doc for the order of attempts.
    pub fn absorb(
        &mut self,
        batch: &[DiscoveryResponse],
        mut apply: impl FnMut(Config) -> Result<u64, String>,
    ) -> Outcome {
        // A response is its type's whole set, so an older response of a type that a later one
        // in the batch replaces is never applied (tried on its own in the passes below, it could
        // land after the newer one and serve the older set); it shares the newer one's verdict.
        let newest: Vec<usize> =
            batch.iter().map(|r| batch.iter().rposition(|n| n.type_url == r.type_url).unwrap_or_default()).collect();
        let mut verdicts: Vec<Option<Verdict>> =
            batch.iter().map(|r| Dynamic::default().set(&r.type_url, &r.resources).err().map(Err)).collect();
        let mut open: Vec<usize> = (0..batch.len()).filter(|&i| newest[i] == i && verdicts[i].is_none()).collect();
        let mut applied = None;

        // Everything at once: the common case, one swap.
        let all = self.with(batch, open.iter().copied());
        // On failure the passes below try again with fewer types, then resource by resource.
        if let Ok(v) = self.try_apply(all, &mut apply) {
            applied = v.or(applied);
            open.iter().for_each(|&i| verdicts[i] = Some(Ok(())));
            open.clear();
        }

        // All but one: a change spanning types (a cluster renamed and the route moved to it)
        // still goes through when an unrelated type of the same revision is bad. Tried one
        // type at a time, each half would fail without the other, both would be NACKed, and the
        // server does not push a NACKed version again.
        if open.len() > 2 {
            for skip in open.clone() {
                let most = self.with(batch, open.iter().copied().filter(|&i| i != skip));
                if let Ok(v) = self.try_apply(most, &mut apply) {
                    applied = v.or(applied);
                    open.iter().filter(|&&i| i != skip).for_each(|&i| verdicts[i] = Some(Ok(())));
                    open = vec![skip];
                    break;
                }
            }
        }

        // One type at a time, until no more progress.
        let mut errors: Vec<String> = vec![String::new(); batch.len()];
        loop {
            let before = open.len();
            open.retain(|&i| {
                let one = self.with(batch, [i]);
                match self.try_apply(one, &mut apply) {
                    Ok(v) => {
                        applied = v.or(applied);
                        verdicts[i] = Some(Ok(()));
                        false
                    }
                    Err(e) => {
                        errors[i] = e;
                        true
                    }
                }
            });
            if open.is_empty() || open.len() == before {
                break;
            }
        }
        for i in open {
            let (v, verdict) = self.resource_by_resource(&batch[i], std::mem::take(&mut errors[i]), &mut apply);
            applied = v.or(applied);
            verdicts[i] = Some(verdict);
        }
        let verdicts = (0..batch.len()).map(|i| verdicts[newest[i]].clone().unwrap_or(Ok(()))).collect();
        Outcome { verdicts, applied }
    }

    /// Applies what can be applied of `response` one resource at a time, after the response as
    /// a whole failed with `whole`; answers the last version applied and the verdict, whose
    /// error names each refused resource's own error.
    fn resource_by_resource(
        &mut self,
        response: &DiscoveryResponse,
        whole: String,
        apply: &mut impl FnMut(Config) -> Result<u64, String>,
    ) -> (Option<u64>, Verdict) {
        let wanted = self.with(std::slice::from_ref(response), [0]);
        let mut pending = self.accepted.changed(&wanted, &response.type_url);
        if pending.len() <= 1 {
            return (None, Err(whole));
        }
        let total = pending.len();
        let mut applied = None;
        let mut errors: Vec<String> = Vec::new();
        loop {
            let before = pending.len();
            errors.clear();
            pending.retain(|name| {
                let mut one = self.accepted.clone();
                one.take(&wanted, &response.type_url, name);
                match self.try_apply(one, apply) {
                    Ok(v) => {
                        applied = v.or(applied);
                        false
                    }
                    Err(e) => {
                        errors.push(e);
                        true
                    }
                }
            });
            if pending.is_empty() || pending.len() == before {
                break;
            }
        }
        if pending.is_empty() {
            // Every change passed (some only after others): what is served now is the push.
            return (applied, Ok(()));
        }
        let (refused, kept) = (errors.len(), total - errors.len());
        (applied, Err(format!("{} ({refused} of {total} changed resources refused, {kept} applied)", errors.join("; "))))
    }

    /// What is served, with the responses `which` of `batch` in place of their types. They
    /// converted fine when the batch came in (failures were recorded then), so `set` cannot
    /// fail here.
    fn with(&self, batch: &[DiscoveryResponse], which: impl IntoIterator<Item = usize>) -> Dynamic {
        let mut d = self.accepted.clone();
        for i in which {
            let _ = d.set(&batch[i].type_url, &batch[i].resources);
        }
        d
    }

    /// Applies `candidate` unless it is what is served already (a reconnect resends
    /// everything; reapplying would only bump the version and rewrite the disk cache).
    fn try_apply(
        &mut self,
        candidate: Dynamic,
        apply: &mut impl FnMut(Config) -> Result<u64, String>,
    ) -> Result<Option<u64>, String> {
        if candidate == self.accepted {
            return Ok(None);
        }
        let v = apply(candidate.merge(&self.bootstrap))?;
        self.accepted = candidate;
        Ok(Some(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_xds::resources::{to_any, v1};
    use weft_xds::typeurl;

    fn bootstrap() -> Config {
        Config::from_yaml("listeners: [{name: out, address: \"127.0.0.1:0\"}]").unwrap()
    }

    /// A stand-in for `Shared::apply`: every route's cluster must exist and have endpoints.
    fn validator(applied: &mut Vec<Config>) -> impl FnMut(Config) -> Result<u64, String> + '_ {
        move |cfg: Config| {
            for c in &cfg.clusters {
                if c.endpoints.is_empty() {
                    return Err(format!("clusters.{}.endpoints: at least one endpoint is required", c.name));
                }
            }
            for s in &cfg.services {
                for r in &s.routes {
                    let c = r.cluster.as_deref().unwrap_or_default();
                    if !cfg.clusters.iter().any(|x| x.name == c) {
                        return Err(format!("services.{}.routes.{}.cluster: unknown cluster {c:?}", s.name, r.name));
                    }
                }
            }
            applied.push(cfg);
            Ok(applied.len() as u64)
        }
    }

    fn clusters(names: &[&str]) -> DiscoveryResponse {
        let resources =
            names.iter().map(|n| to_any(&v1::Cluster { name: (*n).into(), ..Default::default() })).collect();
        DiscoveryResponse { type_url: typeurl::CLUSTER.into(), resources, ..Default::default() }
    }

    fn endpoints(names: &[&str]) -> DiscoveryResponse {
        let resources = names
            .iter()
            .map(|n| {
                to_any(&v1::Endpoints {
                    cluster_name: (*n).into(),
                    endpoints: vec![v1::Endpoint {
                        address: "127.0.0.1:1".into(),
                        healthy: true,
                        ..Default::default()
                    }],
                })
            })
            .collect();
        DiscoveryResponse { type_url: typeurl::ENDPOINTS.into(), resources, ..Default::default() }
    }

    fn services(cluster: &str) -> DiscoveryResponse {
        named_services(&[("s", cluster)])
    }

    /// Services of (name, the cluster of its one route).
    fn named_services(list: &[(&str, &str)]) -> DiscoveryResponse {
        let resources = list
            .iter()
            .map(|(name, cluster)| {
                to_any(&v1::Service {
                    name: (*name).into(),
                    hosts: vec![format!("{name}.example")],
                    routes: vec![v1::Route {
                        name: "r".into(),
                        target: Some(v1::route::Target::Cluster((*cluster).into())),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
            })
            .collect();
        DiscoveryResponse { type_url: typeurl::SERVICE.into(), resources, ..Default::default() }
    }

    fn served(st: &State) -> Vec<(String, String)> {
        let target = |s: &crate::config::Service| s.routes[0].cluster.clone().unwrap_or_default();
        st.accepted().services.iter().map(|s| (s.name.clone(), target(s))).collect()
    }

    /// The fault a new user hit: a service naming a cluster that does not exist made the
    /// sidecar NACK the whole services response, so a good service added later was never
    /// served. Now the bad one is refused alone (a changed one keeps its last good version).
    #[test]
    fn one_bad_resource_does_not_keep_the_others_of_its_type_from_being_served() {
        let mut applied = Vec::new();
        let mut st = State::new(bootstrap());
        st.absorb(&[clusters(&["a"]), endpoints(&["a"]), named_services(&[("s", "a")])], validator(&mut applied));
        let out = st.absorb(&[named_services(&[("s", "a"), ("bad", "nope"), ("new", "a")])], validator(&mut applied));
        let err = out.verdicts[0].clone().unwrap_err();
        assert!(err.starts_with("services.bad.routes.r.cluster: unknown cluster \"nope\""), "{err}");
        assert!(err.ends_with("(1 of 2 changed resources refused, 1 applied)"), "{err}");
        assert!(out.applied.is_some());
        assert_eq!(served(&st), [("s".into(), "a".into()), ("new".into(), "a".into())]);

        // The next push still has the bad one, plus an update of s that breaks it and another
        // new service: s keeps its last good version, the new one is served.
        let out = st.absorb(
            &[named_services(&[("s", "gone"), ("bad", "nope"), ("new", "a"), ("newer", "a")])],
            validator(&mut applied),
        );
        let err = out.verdicts[0].clone().unwrap_err();
        assert!(err.contains("services.s.routes.r.cluster") && err.contains("services.bad."), "{err}");
        assert_eq!(
            served(&st),
            [("s".into(), "a".into()), ("new".into(), "a".into()), ("newer".into(), "a".into())],
            "push order kept, s at its last good version"
        );

        // Fixed at the control plane: everything is served, ACKed.
        let out = st.absorb(
            &[clusters(&["a", "nope"]), endpoints(&["a", "nope"]), named_services(&[("s", "a"), ("bad", "nope"), ("new", "a")])],
            validator(&mut applied),
        );
        assert_eq!(out.verdicts, vec![Ok(()), Ok(()), Ok(())]);
        assert_eq!(served(&st).len(), 3);
    }

    #[test]
    fn a_batch_that_is_only_valid_as_a_whole_is_applied_in_one_swap() {
        let mut applied = Vec::new();
        let mut st = State::new(bootstrap());
        let out = st.absorb(&[clusters(&["a"]), endpoints(&["a"]), services("a")], validator(&mut applied));
        assert_eq!(out, Outcome { verdicts: vec![Ok(()), Ok(()), Ok(())], applied: Some(1) });
        assert_eq!(applied.len(), 1, "one swap for the whole batch");
        assert_eq!(applied[0].clusters[0].endpoints, vec!["127.0.0.1:1".to_string()]);
    }

    #[test]
    fn an_invalid_type_is_nacked_and_the_others_of_the_batch_are_acked() {
        let mut applied = Vec::new();
        let mut st = State::new(bootstrap());
        st.absorb(&[clusters(&["a"]), endpoints(&["a"]), services("a")], validator(&mut applied));
        // New endpoints are fine; a route to an unknown cluster is not.
        let out = st.absorb(&[endpoints(&["a", "b"]), services("nope")], validator(&mut applied));
        assert_eq!(out.verdicts[0], Ok(()));
        assert_eq!(out.verdicts[1], Err("services.s.routes.r.cluster: unknown cluster \"nope\"".into()));
        assert_eq!(st.accepted().services[0].routes[0].cluster.as_deref(), Some("a"), "the old route keeps serving");
        assert_eq!(st.accepted().endpoints.len(), 2);
    }

    #[test]
    fn types_are_tried_in_whatever_order_works() {
        let mut applied = Vec::new();
        let mut st = State::new(bootstrap());
        st.absorb(&[clusters(&["a", "b"]), endpoints(&["a", "b"]), services("a")], validator(&mut applied));
        // Removing cluster a only works after the route moved to b; an invalid third type
        // (endpoints gone) makes the whole-batch attempt fail, so the one-at-a-time pass must
        // find the order that works for the other two.
        let out = st.absorb(&[clusters(&["b"]), services("b"), endpoints(&[])], validator(&mut applied));
        assert_eq!(out.verdicts[..2].to_vec(), vec![Ok::<(), String>(()), Ok(())]);
        let err = out.verdicts[2].clone().unwrap_err();
        assert!(err.starts_with("clusters.b.endpoints: at least one endpoint is required"), "{err}");
        assert_eq!(st.accepted().clusters.len(), 1);
        assert_eq!(st.accepted().endpoints.keys().collect::<Vec<_>>(), ["b"], "a's endpoints could go, b's could not");
    }

    #[test]
    fn types_that_need_each_other_pass_beside_a_bad_one() {
        let mut applied = Vec::new();
        let mut st = State::new(bootstrap());
        st.absorb(&[clusters(&["a"]), endpoints(&["a", "b"]), services("a")], validator(&mut applied));
        // Cluster a renamed to b and the route moved with it: neither works alone (the route
        // would lose its cluster, or point at one that does not exist yet). The endpoints of
        // the same revision are bad.
        let out = st.absorb(&[clusters(&["b"]), services("b"), endpoints(&[])], validator(&mut applied));
        assert_eq!(out.verdicts[..2].to_vec(), vec![Ok::<(), String>(()), Ok(())], "{out:?}");
        assert!(out.verdicts[2].is_err());
        assert_eq!(st.accepted().services[0].routes[0].cluster.as_deref(), Some("b"));
    }

    /// Two responses of one type in a batch: only the later one is served, even when the passes
    /// one type at a time would have found the older one valid last.
    #[test]
    fn of_two_responses_of_one_type_the_later_one_is_served() {
        let mut applied = Vec::new();
        let mut st = State::new(bootstrap());
        st.absorb(&[clusters(&["a"]), endpoints(&["a", "b"]), services("a")], validator(&mut applied));
        let bad_experiment = DiscoveryResponse {
            type_url: typeurl::EXPERIMENT.into(),
            resources: vec![to_any(&v1::Experiment { name: "bad".into(), ..Default::default() })],
            ..Default::default()
        };
        let mut check = validator(&mut applied);
        let with_bad_experiments = |cfg: Config| match cfg.experiments.iter().any(|e| e.name == "bad") {
            true => Err("experiments.bad: refused".to_string()),
            false => check(cfg),
        };
        // Two bad types, so every attempt with more than one type fails and the types are
        // tried one at a time: the older clusters (b only) become valid once the route moved.
        let batch = [clusters(&["b"]), services("b"), clusters(&["a", "b"]), endpoints(&[]), bad_experiment];
        let out = st.absorb(&batch, with_bad_experiments);
        assert_eq!(out.verdicts[..3].to_vec(), vec![Ok::<(), String>(()), Ok(()), Ok(())], "{out:?}");
        let served: Vec<_> = st.accepted().clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(served, vec!["a", "b"], "the later clusters response is served");
    }

    #[test]
    fn an_unchanged_push_is_acked_without_a_new_swap() {
        let mut applied = Vec::new();
        let mut st = State::new(bootstrap());
        st.absorb(&[clusters(&["a"]), endpoints(&["a"])], validator(&mut applied));
        let out = st.absorb(&[clusters(&["a"]), endpoints(&["a"])], validator(&mut applied));
        assert_eq!(out, Outcome { verdicts: vec![Ok(()), Ok(())], applied: None });
        assert_eq!(applied.len(), 1);
    }

    #[test]
    fn restore_serves_a_saved_set_only_if_it_is_valid() {
        let mut applied = Vec::new();
        let mut st = State::new(bootstrap());
        let mut saved = Dynamic::default();
        saved.set(typeurl::SERVICE, &services("gone").resources).unwrap();
        assert!(st.restore(saved.clone(), validator(&mut applied)).is_err());
        assert_eq!(st.accepted(), &Dynamic::default());
        saved.set(typeurl::CLUSTER, &clusters(&["gone"]).resources).unwrap();
        saved.set(typeurl::ENDPOINTS, &endpoints(&["gone"]).resources).unwrap();
        assert_eq!(st.restore(saved.clone(), validator(&mut applied)), Ok(1));
        assert_eq!(st.accepted(), &saved);
    }
}
