//! `/v1/accounts…`: the operator creates, lists, describes and deletes accounts; an account
//! may describe itself and issue itself more API keys, or rotate them (a new key, the others
//! revoked). A deleted account's keys stop working at once; an account that still has
//! clusters is not deleted (EKS-style 409, naming them).

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use http::{HeaderMap, StatusCode};

use crate::error::ManagementError;
use crate::model::*;
use crate::{
    Caller, Result, Service, account_key, accounts_prefix, api_key_key, api_keys_prefix,
    clusters_prefix, json, parse_body,
};

/// The operator only: anyone else is refused with `what` in the message.
async fn require_operator(m: &crate::Management, headers: &HeaderMap, what: &str) -> Result<()> {
    if m.authenticate(headers).await? != Caller::Operator {
        return Err(ManagementError::access_denied(format!(
            "only the operator {what}"
        )));
    }
    Ok(())
}

/// The operator, or the account `account` itself; another account is told it does not exist
/// (its existence is not revealed).
async fn require_operator_or_self(
    m: &crate::Management,
    headers: &HeaderMap,
    account: &str,
) -> Result<()> {
    match m.authenticate(headers).await? {
        Caller::Operator => Ok(()),
        Caller::Account(own) if own == account => Ok(()),
        Caller::Account(_) => Err(ManagementError::not_found(format!(
            "no account {account:?}"
        ))),
    }
}

/// The stored account `id`.
async fn account_record(m: &crate::Management, id: &str) -> Result<(Account, i64)> {
    let kv = m
        .storage
        .get(&account_key(id))
        .await?
        .ok_or_else(|| ManagementError::not_found(format!("no account {id:?}")))?;
    Ok((m.open(&kv)?, kv.mod_revision))
}

/// `GET /v1/identity`: who the credential is (AWS's `GetCallerIdentity`), for clients that
/// show it (the console).
pub(crate) async fn caller_identity(State(m): Service, headers: HeaderMap) -> Result<Response> {
    let identity = match m.authenticate(&headers).await? {
        Caller::Operator => serde_json::json!({ "operator": true }),
        Caller::Account(id) => serde_json::json!({ "operator": false, "accountId": id }),
    };
    Ok(json(StatusCode::OK, &identity))
}

pub(crate) async fn list_accounts(State(m): Service, headers: HeaderMap) -> Result<Response> {
    require_operator(&m, &headers, "lists accounts").await?;
    let accounts: Vec<Account> = m
        .range_all(&accounts_prefix())
        .await?
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "accounts": accounts }),
    ))
}

pub(crate) async fn create_account(
    State(m): Service,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response> {
    require_operator(&m, &headers, "creates accounts").await?;
    let request: CreateAccountRequest = parse_body(&body)?;
    validate_name("account id", &request.id)?;
    if m.storage.get(&account_key(&request.id)).await?.is_some() {
        return Err(ManagementError::in_use(format!(
            "account {:?} already exists",
            request.id
        )));
    }
    m.ensure_account(&request.id).await?;
    let key = m.issue_api_key(&request.id).await?;
    Ok(json(StatusCode::CREATED, &key))
}

pub(crate) async fn describe_account(
    State(m): Service,
    Path(account): Path<String>,
    headers: HeaderMap,
) -> Result<Response> {
    require_operator_or_self(&m, &headers, &account).await?;
    let (record, _) = account_record(&m, &account).await?;
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "account": record }),
    ))
}

/// Deletes an account without clusters, then every API key it has.
pub(crate) async fn delete_account(
    State(m): Service,
    Path(account): Path<String>,
    headers: HeaderMap,
) -> Result<Response> {
    require_operator(&m, &headers, "deletes accounts").await?;
    let (record, revision) = account_record(&m, &account).await?;
    let clusters: Vec<String> = m
        .range_all::<Cluster>(&clusters_prefix(&account))
        .await?
        .into_iter()
        .map(|(c, _)| c.name)
        .collect();
    if !clusters.is_empty() {
        return Err(ManagementError::in_use(format!(
            "account {account:?} still has clusters ({}); delete them first",
            clusters.join(", ")
        )));
    }
    // The record goes first (only if unchanged since it was read), so a concurrent delete
    // answers 404 rather than both revoking keys.
    if let flotilla_storage::Outcome::Conflict(_) = m
        .storage
        .delete(&account_key(&account), Some(revision))
        .await?
    {
        return Err(ManagementError::not_found(format!(
            "no account {account:?}"
        )));
    }
    revoke_keys(&m, &account, None).await?;
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({ "account": record }),
    ))
}

/// Deletes every API key of `account` except the one stored under `keep` (a record key).
async fn revoke_keys(m: &crate::Management, account: &str, keep: Option<&str>) -> Result<()> {
    for kv in m.range_kvs(&api_keys_prefix()).await? {
        let issued: IssuedApiKey = m.open(&kv)?;
        if issued.account_id == account && Some(kv.key.as_str()) != keep {
            m.storage.delete(&kv.key, None).await?;
        }
    }
    Ok(())
}

/// `POST /v1/accounts/{id}/apikeys[?rotate=true]`: another key; with `rotate`, the account's
/// other keys stop working at once (the caller's own too, when it is one of them).
pub(crate) async fn create_api_key(
    State(m): Service,
    Path(account): Path<String>,
    Query(query): Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
) -> Result<Response> {
    require_operator_or_self(&m, &headers, &account).await?;
    let rotate = match query.get("rotate").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ManagementError::invalid_parameter(format!(
                "rotate must be true or false, not {other:?}"
            )));
        }
    };
    let issued = m.issue_api_key(&account).await?;
    if rotate {
        let kept = api_key_key(&crate::sha256_hex(&issued.api_key));
        revoke_keys(&m, &account, Some(&kept)).await?;
    }
    Ok(json(StatusCode::CREATED, &issued))
}
