//! `resource "flotilla_account"`: an account of the service, made with the operator's
//! credentials, and its first API key as a sensitive attribute (as `aws_iam_access_key`'s
//! `secret`). The id replaces the account when it changes; destroy refuses (with the API's
//! message) while the account still has clusters; `terraform import flotilla_account.X ID`
//! brings in the account but not a key — a key is shown only once, when it is issued.

use async_trait::async_trait;
use http::Method;
use serde::{Deserialize, Serialize};
use tf_provider::schema::{AttributeConstraint, AttributeType, Schema};
use tf_provider::value::{Value, ValueEmpty, ValueString};
use tf_provider::{AttributePath, Diagnostics, Resource};

use crate::common::{attribute, get_if_found, json_text, reported, schema};
use crate::provider::Connection;

/// The resource's attributes (Terraform's names).
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct AccountResourceState<'a> {
    #[serde(borrow = "'a")]
    id: ValueString<'a>,
    created_at: ValueString<'a>,
    api_key: ValueString<'a>,
}

/// `flotilla_account`.
pub struct AccountResource {
    connection: Connection,
}

impl AccountResource {
    /// Acts through `connection` once the provider is configured.
    pub fn new(connection: Connection) -> Self {
        AccountResource { connection }
    }
}

/// The account `id`, `None` when there is none.
async fn describe(
    client: &flotilla_management_client::ManagementClient,
    id: &str,
) -> anyhow::Result<Option<serde_json::Value>> {
    Ok(get_if_found(client, &format!("/v1/accounts/{id}"))
        .await?
        .map(|answer| answer["account"].clone()))
}

/// The state of an account document, with `api_key` (which the API shows only at creation).
fn state_of<'a>(account: &serde_json::Value, api_key: ValueString<'a>) -> AccountResourceState<'a> {
    AccountResourceState {
        id: json_text(account, "/id"),
        created_at: json_text(account, "/createdAt"),
        api_key,
    }
}

/// Whether the plan from `prior` to `proposed` replaces the account (its id changes).
fn replaces(prior: &AccountResourceState<'_>, proposed: &AccountResourceState<'_>) -> bool {
    proposed.id.as_deref_option().is_some() && proposed.id != prior.id
}

#[async_trait]
impl Resource for AccountResource {
    type State<'a> = AccountResourceState<'a>;
    type PrivateState<'a> = ValueEmpty;
    type ProviderMetaState<'a> = ValueEmpty;

    fn schema(&self, _diags: &mut Diagnostics) -> Option<Schema> {
        use AttributeConstraint::{Computed, Required};
        let mut api_key = attribute(
            AttributeType::String,
            Computed,
            "The account's first API key (flo_…): kept in the state, shown by the API only once; null after an import.",
        );
        api_key.sensitive = true;
        let attributes = [
            (
                "id",
                attribute(
                    AttributeType::String,
                    Required,
                    "The account's id, a DNS label (replaces the account when changed).",
                ),
            ),
            (
                "created_at",
                attribute(
                    AttributeType::String,
                    Computed,
                    "When it was created (RFC 3339).",
                ),
            ),
            ("api_key", api_key),
        ]
        .into_iter()
        .map(|(name, attribute)| (name.to_string(), attribute))
        .collect();
        Some(schema(
            "An account of the service and its first API key; needs the operator's credentials.",
            attributes,
            Vec::new(),
        ))
    }

    async fn validate<'a>(&self, diags: &mut Diagnostics, config: Self::State<'a>) -> Option<()> {
        if let Some(id) = config.id.as_deref_option()
            && let Some(problem) =
                flotilla_api_machinery::names::management_name_problems(id).first()
        {
            diags.error_short(
                format!("account id {id:?} is invalid: {problem}"),
                AttributePath::new("id"),
            );
        }
        Some(())
    }

    async fn read<'a>(
        &self,
        diags: &mut Diagnostics,
        state: Self::State<'a>,
        private_state: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>)> {
        let client = self.connection.client(diags)?;
        let id = state.id.as_deref_option()?.to_string();
        match describe(&client, &id).await {
            // Deleted behind Terraform's back: the plan re-creates it.
            Ok(None) => None,
            Ok(Some(account)) => Some((state_of(&account, state.api_key.clone()), private_state)),
            Err(err) => {
                diags.root_error_short(format!("{err:#}"));
                Some((state, private_state))
            }
        }
    }

    async fn plan_create<'a>(
        &self,
        _diags: &mut Diagnostics,
        proposed: Self::State<'a>,
        _config: Self::State<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>)> {
        Some((
            AccountResourceState {
                created_at: Value::Unknown,
                api_key: Value::Unknown,
                ..proposed
            },
            ValueEmpty::default(),
        ))
    }

    async fn plan_update<'a>(
        &self,
        _diags: &mut Diagnostics,
        prior: Self::State<'a>,
        proposed: Self::State<'a>,
        _config: Self::State<'a>,
        private: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>, Vec<AttributePath>)> {
        let replace = if replaces(&prior, &proposed) {
            vec![AttributePath::new("id")]
        } else {
            Vec::new()
        };
        Some((proposed, private, replace))
    }

    async fn plan_destroy<'a>(
        &self,
        _diags: &mut Diagnostics,
        _prior: Self::State<'a>,
        private: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<Self::PrivateState<'a>> {
        Some(private)
    }

    async fn create<'a>(
        &self,
        diags: &mut Diagnostics,
        planned: Self::State<'a>,
        _config: Self::State<'a>,
        private: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>)> {
        let client = self.connection.client(diags)?;
        let id = planned.id.as_deref_option()?.to_string();
        let created = async {
            let issued = client
                .call_json(
                    Method::POST,
                    "/v1/accounts",
                    Some(&serde_json::json!({ "id": id })),
                )
                .await?;
            let account = describe(&client, &id)
                .await?
                .ok_or_else(|| anyhow::anyhow!("account {id} disappeared while being created"))?;
            anyhow::Ok((account, json_text(&issued, "/apiKey")))
        };
        match created.await {
            Ok((account, key)) => Some((state_of(&account, key), private)),
            Err(err) => {
                diags.error_short(format!("{err:#}"), AttributePath::new("id"));
                None
            }
        }
    }

    async fn update<'a>(
        &self,
        _diags: &mut Diagnostics,
        _prior: Self::State<'a>,
        planned: Self::State<'a>,
        _config: Self::State<'a>,
        private: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>)> {
        // Nothing of an account changes in place (its id replaces it).
        Some((planned, private))
    }

    async fn destroy<'a>(
        &self,
        diags: &mut Diagnostics,
        prior: Self::State<'a>,
        _private: Self::PrivateState<'a>,
        _meta: Self::ProviderMetaState<'a>,
    ) -> Option<()> {
        let client = self.connection.client(diags)?;
        let id = prior.id.as_deref_option()?.to_string();
        let deleted = async {
            if describe(&client, &id).await?.is_some() {
                client
                    .call_json(Method::DELETE, &format!("/v1/accounts/{id}"), None)
                    .await?;
            }
            anyhow::Ok(())
        };
        reported(diags, deleted.await)
    }

    async fn import<'a>(
        &self,
        diags: &mut Diagnostics,
        id: String,
    ) -> Option<(Self::State<'a>, Self::PrivateState<'a>)> {
        let client = self.connection.client(diags)?;
        match describe(&client, &id).await {
            Ok(Some(account)) => Some((state_of(&account, Value::Null), ValueEmpty::default())),
            Ok(None) => {
                diags.root_error_short(format!("no account {id:?} to import"));
                None
            }
            Err(err) => {
                diags.root_error_short(format!("{err:#}"));
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::owned;

    #[test]
    fn the_answer_becomes_the_state_and_only_the_id_replaces() {
        let account = serde_json::json!({"id": "acme", "createdAt": "2026-12-06T03:00:00Z"});
        let state = state_of(&account, owned("flo_abc"));
        assert_eq!(state.id.as_deref_option(), Some("acme"));
        assert_eq!(
            state.created_at.as_deref_option(),
            Some("2026-12-06T03:00:00Z")
        );
        assert_eq!(state.api_key.as_deref_option(), Some("flo_abc"));
        let mut proposed = state.clone();
        assert!(!replaces(&state, &proposed));
        proposed.id = Value::Unknown;
        assert!(!replaces(&state, &proposed), "unknown until apply");
        proposed.id = owned("other");
        assert!(replaces(&state, &proposed));
    }
}
