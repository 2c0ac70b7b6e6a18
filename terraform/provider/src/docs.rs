//! The provider's reference documentation, generated from the schemas Terraform is served
//! (`terraform-provider-flotilla docs DIR`), in the registry's layout: `index.md`,
//! `resources/NAME.md`, `data-sources/NAME.md`. A unit test keeps `terraform/docs/` equal to
//! what the schemas say, so an attribute cannot be added without its documentation.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use tf_provider::schema::{
    Attribute, AttributeConstraint, AttributeType, Block, NestedBlock, Schema,
};
use tf_provider::{Diagnostics, Provider};

use crate::provider::FlotillaProvider;

/// How `terraform import` names each resource (not part of a schema).
const IMPORT_IDS: [(&str, &str); 3] = [
    ("flotilla_account", "ACCOUNT_ID"),
    ("flotilla_cluster", "CLUSTER_NAME"),
    ("flotilla_node_pool", "CLUSTER_NAME/POOL_NAME"),
];

/// Every page, by its path under the documentation directory.
pub fn pages() -> BTreeMap<PathBuf, String> {
    let provider = FlotillaProvider::default();
    let mut diags = Diagnostics::default();
    let mut pages = BTreeMap::new();
    if let Some(schema) = provider.schema(&mut diags) {
        pages.insert(PathBuf::from("index.md"), provider_page(&schema));
    }
    for (name, resource) in provider.get_resources(&mut diags).unwrap_or_default() {
        if let Some(schema) = resource.schema(&mut diags) {
            let name = format!("flotilla_{name}");
            pages.insert(
                Path::new("resources").join(format!("{name}.md")),
                object_page(&name, "Resource", &schema),
            );
        }
    }
    for (name, source) in provider.get_data_sources(&mut diags).unwrap_or_default() {
        if let Some(schema) = source.schema(&mut diags) {
            let name = format!("flotilla_{name}");
            pages.insert(
                Path::new("data-sources").join(format!("{name}.md")),
                object_page(&name, "Data Source", &schema),
            );
        }
    }
    pages
}

/// Writes every page under `dir`.
pub fn write(dir: &Path) -> anyhow::Result<()> {
    for (path, text) in pages() {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, text)?;
    }
    Ok(())
}

const HEADER: &str = "<!-- generated from the provider's schemas by `terraform-provider-flotilla docs terraform/docs`; do not edit -->\n\n";

fn provider_page(schema: &Schema) -> String {
    let mut page = String::from(HEADER);
    let _ = writeln!(page, "# flotilla Provider\n");
    let _ = writeln!(page, "{}\n", schema.block.description.content);
    let _ = writeln!(
        page,
        "Every setting may be left out when the environment holds it (the variable named with it), so with `FLOTILLA_CONFIG` pointing at the `flotilla.json` that `flotilla up` writes, an empty block works:\n"
    );
    let _ = writeln!(
        page,
        "```hcl\nterraform {{\n  required_providers {{\n    flotilla = {{ source = \"flotilla/flotilla\" }}\n  }}\n}}\n\nprovider \"flotilla\" {{}}\n\nresource \"flotilla_cluster\" \"prod\" {{\n  name = \"prod\"\n  tags = {{ team = \"platform\" }}\n}}\n```\n"
    );
    block_sections(&mut page, &schema.block, "");
    page
}

fn object_page(name: &str, kind: &str, schema: &Schema) -> String {
    let mut page = String::from(HEADER);
    let _ = writeln!(page, "# {name} ({kind})\n");
    let _ = writeln!(page, "{}\n", schema.block.description.content);
    block_sections(&mut page, &schema.block, "");
    if let Some((_, id)) = IMPORT_IDS
        .iter()
        .find(|(resource, _)| kind == "Resource" && *resource == name)
    {
        let _ = writeln!(
            page,
            "## Import\n\n```sh\nterraform import {name}.EXAMPLE {id}\n```"
        );
    }
    page
}

/// The Required / Optional / Read-Only lists of `block`, then each nested block's.
fn block_sections(page: &mut String, block: &Block, under: &str) {
    let title = if under.is_empty() {
        "## Schema".to_string()
    } else {
        format!("### Nested Schema for `{under}`")
    };
    let _ = writeln!(page, "{title}\n");
    let attributes: BTreeMap<&String, &Attribute> = block.attributes.iter().collect();
    let blocks: BTreeMap<&String, &NestedBlock> = block.blocks.iter().collect();
    for (heading, wanted) in [
        ("Required", Kind::Required),
        ("Optional", Kind::Optional),
        ("Read-Only", Kind::ReadOnly),
    ] {
        let mut lines = Vec::new();
        for (name, attribute) in &attributes {
            if kind_of(&attribute.constraint) == wanted {
                let sensitive = if attribute.sensitive {
                    ", Sensitive"
                } else {
                    ""
                };
                lines.push(format!(
                    "- `{name}` ({}{sensitive}) {}",
                    type_name(&attribute.attr_type),
                    attribute.description.content
                ));
            }
        }
        if wanted == Kind::Optional {
            for (name, nested) in &blocks {
                let (block, how) = nested_parts(nested);
                let path = if under.is_empty() {
                    name.to_string()
                } else {
                    format!("{under}.{name}")
                };
                lines.push(format!(
                    "- `{name}` (Block, {how}) {} (see [below](#nestedblock--{}))",
                    block.description.content,
                    path.replace('.', "--")
                ));
            }
        }
        if !lines.is_empty() {
            // Nested blocks' lists are labels, as the registry's pages have them.
            let heading = if under.is_empty() {
                format!("### {heading}")
            } else {
                format!("{heading}:")
            };
            let _ = writeln!(page, "{heading}\n\n{}\n", lines.join("\n"));
        }
    }
    for (name, nested) in blocks {
        let path = if under.is_empty() {
            name.to_string()
        } else {
            format!("{under}.{name}")
        };
        let _ = writeln!(
            page,
            "<a id=\"nestedblock--{}\"></a>",
            path.replace('.', "--")
        );
        block_sections(page, nested_parts(nested).0, &path);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Required,
    Optional,
    ReadOnly,
}

fn kind_of(constraint: &AttributeConstraint) -> Kind {
    match constraint {
        AttributeConstraint::Required => Kind::Required,
        AttributeConstraint::Optional | AttributeConstraint::OptionalComputed => Kind::Optional,
        AttributeConstraint::Computed => Kind::ReadOnly,
    }
}

/// A nested block's schema and how often it may appear.
fn nested_parts(nested: &NestedBlock) -> (&Block, &'static str) {
    match nested {
        NestedBlock::Single(block) => (block, "exactly once"),
        NestedBlock::List(block) => (block, "any number"),
        NestedBlock::Set(block) => (block, "a set"),
        NestedBlock::Map(block) => (block, "by name"),
        NestedBlock::Group(block) | NestedBlock::Optional(block) => (block, "at most once"),
    }
}

/// The type as the registry's documentation writes it (`List of String`).
fn type_name(kind: &AttributeType) -> String {
    match kind {
        AttributeType::String => "String".into(),
        AttributeType::Number => "Number".into(),
        AttributeType::Bool => "Boolean".into(),
        AttributeType::List(inner) => format!("List of {}", type_name(inner)),
        AttributeType::Set(inner) => format!("Set of {}", type_name(inner)),
        AttributeType::Map(inner) => format!("Map of {}", type_name(inner)),
        AttributeType::Object(_) | AttributeType::AttributeSingle(_) => "Object".into(),
        AttributeType::Tuple(_) => "Tuple".into(),
        AttributeType::AttributeList(_) => "List of Object".into(),
        AttributeType::AttributeSet(_) => "Set of Object".into(),
        AttributeType::AttributeMap(_) => "Map of Object".into(),
        AttributeType::Any => "Dynamic".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `terraform/docs/` is what the schemas say (regenerate with
    /// `cargo run -p terraform-provider-flotilla -- docs terraform/docs`).
    #[test]
    fn the_committed_reference_is_what_the_schemas_say() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
        let mut stale = Vec::new();
        let generated = pages();
        for (path, text) in &generated {
            if std::fs::read_to_string(dir.join(path)).ok().as_ref() != Some(text) {
                stale.push(path.display().to_string());
            }
        }
        assert!(
            stale.is_empty(),
            "terraform/docs is out of date for {stale:?}: run `cargo run -p terraform-provider-flotilla -- docs terraform/docs`"
        );
        for kind in ["resources", "data-sources"] {
            for entry in std::fs::read_dir(dir.join(kind))
                .into_iter()
                .flatten()
                .flatten()
            {
                let path = Path::new(kind).join(entry.file_name());
                assert!(
                    generated.contains_key(&path),
                    "terraform/docs/{} documents nothing the provider serves",
                    path.display()
                );
            }
        }
        assert!(generated.contains_key(Path::new("resources/flotilla_account.md")));
        assert!(
            generated[Path::new("resources/flotilla_cluster.md")]
                .contains("### Nested Schema for `cloud`")
        );
    }
}
