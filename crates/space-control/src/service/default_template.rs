//! The template a create that names none gets: `default` (the host's directories)
//! unless the operator chose an imported one (`ControlConfig::default_template`, or
//! `space up --default-template debian` once its image is imported).

use super::plane::ControlPlane;

impl ControlPlane {
    /// The template of a create that names none.
    pub fn default_template(&self) -> String {
        self.default_template
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Sets the template of a create that names none (`default`, or `name[:tag]` of
    /// an imported template: a create then pins its digest as for a named one, and
    /// fails while no template has that name).
    pub fn set_default_template(&self, template: &str) {
        *self
            .default_template
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = template.to_owned();
    }
}
