//! Kubernetes Events about pods (`events.k8s.io/v1`), written without a cache.
//!
//! kube's `Recorder` keeps every Event it published for six minutes to fold repeats into a
//! series. This crate publishes at most a few Events per pod over its life (provisioned,
//! re-adopted, updated), so there is nothing to fold, and with thousands of pods that cache
//! was a few KiB of memory per pod. Each Event is created and forgotten.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};

/// Normal or Warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Something happened as intended.
    Normal,
    /// Something the pod's owner should look at.
    Warning,
}

/// Publishes Events as one reporting controller and instance.
#[derive(Clone)]
pub(crate) struct Publisher {
    client: Client,
    controller: String,
    instance: String,
}

impl Publisher {
    pub(crate) fn new(client: Client, controller: &str, instance: &str) -> Publisher {
        Publisher {
            client,
            controller: controller.to_string(),
            instance: instance.to_string(),
        }
    }

    /// Creates one Event about `pod`.
    pub(crate) async fn publish(
        &self,
        pod: &Pod,
        type_: EventType,
        reason: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            action: Some(reason.to_string()),
            reason: Some(reason.to_string()),
            note: Some(note.to_string()),
            event_time: Some(MicroTime(now)),
            regarding: Some(ObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some("Pod".to_string()),
                name: Some(name),
                namespace: Some(namespace.clone()),
                uid: pod.metadata.uid.clone(),
                resource_version: pod.metadata.resource_version.clone(),
                ..ObjectReference::default()
            }),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(
                match type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_string(),
            ),
            ..Event::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await?;
        Ok(())
    }
}
