//! The CRI v1 client over containerd's Unix socket (the only place that speaks gRPC), with
//! the few helpers the pod loop needs on top of the generated stubs.

use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

/// Why the runtime could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The endpoint is not `unix:///path`.
    #[error("the container runtime endpoint {0} is not unix:///path")]
    Endpoint(String),
    /// The socket does not answer.
    #[error("connecting to the container runtime at {path}")]
    Connect {
        /// The socket.
        path: String,
        /// Why.
        #[source]
        source: tonic::transport::Error,
    },
    /// A call failed.
    #[error("CRI {call}: {}", .source.message())]
    Call {
        /// The RPC.
        call: &'static str,
        /// The gRPC status.
        #[source]
        source: tonic::Status,
    },
}

/// Both CRI services on one channel.
#[derive(Clone)]
pub struct Cri {
    /// RuntimeService.
    pub runtime: RuntimeServiceClient<Channel>,
    /// ImageService.
    pub images: ImageServiceClient<Channel>,
}

/// Shorthand for mapping a tonic status into [`CriError::Call`].
pub fn call(name: &'static str) -> impl FnOnce(tonic::Status) -> CriError {
    move |source| CriError::Call { call: name, source }
}

impl Cri {
    /// Connects to `unix:///path` (the kubelet's `--container-runtime-endpoint`).
    pub async fn connect(endpoint: &str) -> Result<Self, CriError> {
        let path = endpoint
            .strip_prefix("unix://")
            .filter(|p| p.starts_with('/'))
            .ok_or_else(|| CriError::Endpoint(endpoint.to_string()))?;
        let socket = PathBuf::from(path);
        // The URI is only a placeholder: the connector dials the socket.
        let channel = Endpoint::from_static("http://[::1]:50051")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let socket = socket.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(socket).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|source| CriError::Connect {
                path: path.to_string(),
                source,
            })?;
        Ok(Self {
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        })
    }

    /// `Version`: (runtime name, runtime version).
    pub async fn version(&mut self) -> Result<cri::VersionResponse, CriError> {
        Ok(self
            .runtime
            .version(cri::VersionRequest {
                version: "v1".into(),
            })
            .await
            .map_err(call("Version"))?
            .into_inner())
    }

    /// The local image `image` names, if the node has it.
    pub async fn image(&mut self, image: &str) -> Result<Option<cri::Image>, CriError> {
        Ok(self
            .images
            .image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image: image.to_string(),
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .map_err(call("ImageStatus"))?
            .into_inner()
            .image)
    }

    /// Every sandbox of the kubelet's pods (those with a pod UID label), or of one pod.
    pub async fn sandboxes(&mut self, uid: Option<&str>) -> Result<Vec<cri::PodSandbox>, CriError> {
        let filter = uid.map(|uid| cri::PodSandboxFilter {
            label_selector: [(crate::translate::POD_UID_LABEL.to_string(), uid.to_string())].into(),
            ..Default::default()
        });
        let items = self
            .runtime
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter })
            .await
            .map_err(call("ListPodSandbox"))?
            .into_inner()
            .items;
        Ok(items
            .into_iter()
            .filter(|s| s.labels.contains_key(crate::translate::POD_UID_LABEL))
            .collect())
    }

    /// The containers of one pod.
    pub async fn containers(&mut self, uid: &str) -> Result<Vec<cri::Container>, CriError> {
        let filter = cri::ContainerFilter {
            label_selector: [(crate::translate::POD_UID_LABEL.to_string(), uid.to_string())].into(),
            ..Default::default()
        };
        Ok(self
            .runtime
            .list_containers(cri::ListContainersRequest {
                filter: Some(filter),
            })
            .await
            .map_err(call("ListContainers"))?
            .into_inner()
            .containers)
    }

    /// Every container the runtime has (for the relist).
    pub async fn all_containers(&mut self) -> Result<Vec<cri::Container>, CriError> {
        Ok(self
            .runtime
            .list_containers(cri::ListContainersRequest { filter: None })
            .await
            .map_err(call("ListContainers"))?
            .into_inner()
            .containers)
    }

    /// `ContainerStatus` of one container.
    pub async fn container_status(
        &mut self,
        id: &str,
    ) -> Result<Option<cri::ContainerStatus>, CriError> {
        Ok(self
            .runtime
            .container_status(cri::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            })
            .await
            .map_err(call("ContainerStatus"))?
            .into_inner()
            .status)
    }

    /// `UpdateContainerResources`: new cgroup limits for a running container (a resize).
    pub async fn update_resources(
        &mut self,
        id: &str,
        linux: cri::LinuxContainerResources,
    ) -> Result<(), CriError> {
        self.runtime
            .update_container_resources(cri::UpdateContainerResourcesRequest {
                container_id: id.to_string(),
                linux: Some(linux),
                ..Default::default()
            })
            .await
            .map_err(call("UpdateContainerResources"))?;
        Ok(())
    }

    /// `PodSandboxStatus` of one sandbox.
    pub async fn sandbox_status(
        &mut self,
        id: &str,
    ) -> Result<Option<cri::PodSandboxStatus>, CriError> {
        Ok(self
            .runtime
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.to_string(),
                verbose: false,
            })
            .await
            .map_err(call("PodSandboxStatus"))?
            .into_inner()
            .status)
    }

    /// Stops `id` with `timeout` seconds of grace (SIGTERM, then SIGKILL).
    pub async fn stop_container(&mut self, id: &str, timeout: i64) -> Result<(), CriError> {
        self.runtime
            .stop_container(cri::StopContainerRequest {
                container_id: id.to_string(),
                timeout,
            })
            .await
            .map_err(call("StopContainer"))?;
        Ok(())
    }

    /// Stops then removes a sandbox (and, in the runtime, its containers).
    pub async fn remove_sandbox(&mut self, id: &str) -> Result<(), CriError> {
        self.runtime
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
            .map_err(call("StopPodSandbox"))?;
        self.runtime
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            })
            .await
            .map_err(call("RemovePodSandbox"))?;
        Ok(())
    }
}
