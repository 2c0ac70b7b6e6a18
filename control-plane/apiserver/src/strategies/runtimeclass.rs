//! The RuntimeClass strategy (`node.k8s.io/v1`): upstream's printer columns. What a class
//! does to a pod is the RuntimeClass admission plugin's.

use super::*;

/// RuntimeClasses: Name, Handler, Age.
pub struct RuntimeClassStrategy;
impl Strategy for RuntimeClassStrategy {
    fn columns(&self) -> Vec<Column> {
        vec![
            name_column(),
            Column::new(
                "Handler",
                "string",
                "Handler specifies the underlying runtime and configuration that the CRI implementation will use to handle pods of this class.",
                |o| json!(str_at(o, &["handler"]).unwrap_or("")),
            ),
            age_column(),
        ]
    }
}
