//! The MCP annotations of a tool.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use crate::{context::Target, protocol::ToolAnnotations};

/// The annotations the guard read from trusted servers' `tools/list` responses, per (target,
/// tool), bounded: past [`MAX_TOOLS`](Self::MAX_TOOLS) entries a new tool is not recorded (it
/// stays irreversible, the safe default) while the tools already known are still updated.
///
/// # Clone
///
/// Clones share one map.
#[derive(Debug, Clone, Default)]
pub(crate) struct AnnotationCache {
    tools: Arc<Mutex<HashMap<(Target, String), ToolAnnotations>>>,
}

impl AnnotationCache {
    /// The most (target, tool) pairs kept.
    pub(crate) const MAX_TOOLS: usize = 4096;

    /// Records the annotations a `tools/list` page of `target` published (a later list
    /// replaces a tool's earlier hints).
    pub(crate) fn record(
        &self,
        target: &Target,
        listed: impl IntoIterator<Item = (String, ToolAnnotations)>,
    ) {
        let mut tools = self.tools.lock().unwrap_or_else(|e| e.into_inner());
        for (name, annotations) in listed {
            let key = (target.clone(), name);
            if tools.len() < Self::MAX_TOOLS || tools.contains_key(&key) {
                tools.insert(key, annotations);
            }
        }
    }

    /// The annotations `target` published for `tool`, if its list was seen.
    pub(crate) fn get(&self, target: &Target, tool: &str) -> Option<ToolAnnotations> {
        let tools = self.tools.lock().unwrap_or_else(|e| e.into_inner());
        // The map is keyed by owned pairs; a lookup builds one (a call is rare next to its I/O).
        tools.get(&(target.clone(), tool.to_owned())).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_per_target_and_bounded() {
        let cache = AnnotationCache::default();
        let a: Target = "a/mcp".into();
        let hint = ToolAnnotations {
            idempotent_hint: Some(true),
            ..Default::default()
        };
        cache.record(&a, [("t".to_owned(), hint)]);
        assert_eq!(cache.get(&a, "t"), Some(hint));
        assert_eq!(cache.get(&"b/mcp".into(), "t"), None);
        let many = (0..AnnotationCache::MAX_TOOLS + 10).map(|i| (format!("x{i}"), hint));
        cache.record(&a, many);
        assert_eq!(
            cache.tools.lock().unwrap().len(),
            AnnotationCache::MAX_TOOLS
        );
        // A known tool is still updated when the map is full.
        cache.record(&a, [("t".to_owned(), ToolAnnotations::default())]);
        assert_eq!(cache.get(&a, "t"), Some(ToolAnnotations::default()));
    }
}
