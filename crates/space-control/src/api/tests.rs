//! The route tables against the document: what the standalone edge serves itself is
//! described in the document it serves.

use super::*;

#[test]
fn every_route_of_the_standalone_edge_is_in_the_edge_document() {
    let whole = document();
    let (_, edge) = edge_routes().split_for_parts();
    assert!(!edge.paths.paths.is_empty());
    for (path, item) in &edge.paths.paths {
        let described = whole
            .paths
            .paths
            .get(path)
            .unwrap_or_else(|| panic!("{path} is not in the edge document"));
        let ops = |i: &utoipa::openapi::PathItem| {
            [
                i.get.is_some(),
                i.put.is_some(),
                i.post.is_some(),
                i.delete.is_some(),
                i.patch.is_some(),
            ]
        };
        for (served, doc) in ops(item).into_iter().zip(ops(described)) {
            assert!(!served || doc, "{path}: a method served is not described");
        }
    }
}
