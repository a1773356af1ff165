//! RBAC from a rendered `Role` and `RoleBinding` (`--role FILE`).

use serde_json::Value;

/// One rule of the Role.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    api_groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    resource_names: Vec<String>,
}

/// The Role the kubeconfig's user is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rbac {
    /// The Role's namespace.
    pub namespace: String,
    /// `system:serviceaccount:NS:SA`.
    pub user: String,
    rules: Vec<Rule>,
}

/// One request to check.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: &'a str,
    /// The API group.
    pub group: &'a str,
    /// The resource (`pods`).
    pub resource: &'a str,
    /// The subresource (`log`), or empty.
    pub subresource: &'a str,
    /// The namespace, or empty for a cluster-scoped request.
    pub namespace: &'a str,
    /// The object's name, or empty.
    pub name: &'a str,
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

impl Rbac {
    /// Reads a YAML stream holding a `Role` and a `RoleBinding` (other documents ignored).
    ///
    /// # Errors
    ///
    /// Unparseable YAML, or no Role, no RoleBinding, or a binding without a
    /// ServiceAccount subject or for another Role.
    pub fn from_yaml(text: &str) -> Result<Self, String> {
        let mut role: Option<Value> = None;
        let mut binding: Option<Value> = None;
        for document in serde_norway::Deserializer::from_str(text) {
            let value: Value = serde::Deserialize::deserialize(document)
                .map_err(|e| format!("the role file is not a YAML stream: {e}"))?;
            match value["kind"].as_str() {
                Some("Role") if role.is_none() => role = Some(value),
                Some("RoleBinding") if binding.is_none() => binding = Some(value),
                _ => {}
            }
        }
        let role = role.ok_or("the role file holds no Role")?;
        let binding = binding.ok_or("the role file holds no RoleBinding")?;
        let role_name = role["metadata"]["name"].as_str().unwrap_or_default();
        let namespace = role["metadata"]["namespace"]
            .as_str()
            .ok_or("the Role has no metadata.namespace")?
            .to_owned();
        if binding["roleRef"]["kind"].as_str() != Some("Role")
            || binding["roleRef"]["name"].as_str() != Some(role_name)
        {
            return Err(format!(
                "the RoleBinding does not refer to the Role {role_name:?}"
            ));
        }
        let subject = binding["subjects"]
            .as_array()
            .and_then(|s| {
                s.iter()
                    .find(|s| s["kind"].as_str() == Some("ServiceAccount"))
            })
            .ok_or("the RoleBinding has no ServiceAccount subject")?;
        let sa = subject["name"].as_str().ok_or("the subject has no name")?;
        let sa_ns = subject["namespace"].as_str().unwrap_or(&namespace);
        let rules = role["rules"]
            .as_array()
            .map(|rules| {
                rules
                    .iter()
                    .map(|r| Rule {
                        api_groups: strings(&r["apiGroups"]),
                        resources: strings(&r["resources"]),
                        verbs: strings(&r["verbs"]),
                        resource_names: strings(&r["resourceNames"]),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            user: format!("system:serviceaccount:{sa_ns}:{sa}"),
            namespace,
            rules,
        })
    }

    /// Whether the Role allows the request.
    pub fn allows(&self, a: &Attributes<'_>) -> bool {
        if a.namespace != self.namespace {
            return false;
        }
        let resource = if a.subresource.is_empty() {
            a.resource.to_owned()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        let any = |list: &[String], item: &str| list.iter().any(|x| x == "*" || x == item);
        self.rules.iter().any(|r| {
            any(&r.api_groups, a.group)
                && any(&r.resources, &resource)
                && any(&r.verbs, a.verb)
                && (r.resource_names.is_empty()
                    || (!a.name.is_empty() && r.resource_names.iter().any(|n| n == a.name)))
        })
    }

    /// The real server's message for a refused request.
    pub fn forbidden_message(&self, a: &Attributes<'_>) -> String {
        let qualified = if a.group.is_empty() {
            a.resource.to_owned()
        } else {
            format!("{}.{}", a.resource, a.group)
        };
        let object = if a.name.is_empty() {
            qualified
        } else {
            format!("{qualified} \"{}\"", a.name)
        };
        let resource = if a.subresource.is_empty() {
            a.resource.to_owned()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        let scope = if a.namespace.is_empty() {
            "at the cluster scope".to_owned()
        } else {
            format!("in the namespace \"{}\"", a.namespace)
        };
        format!(
            "{object} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
            self.user, a.verb, a.group
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLE: &str = "---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: agentry, namespace: agents}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: agentry, namespace: agents}\nrules:\n- apiGroups: [batch]\n  resources: [jobs]\n  verbs: [create, get]\n- apiGroups: ['']\n  resources: [pods, pods/log]\n  verbs: [get, list, watch]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: agentry, namespace: agents}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: agentry}\nsubjects:\n- {kind: ServiceAccount, name: agentry, namespace: agents}\n";

    fn attrs<'a>(
        verb: &'a str,
        group: &'a str,
        resource: &'a str,
        sub: &'a str,
        ns: &'a str,
    ) -> Attributes<'a> {
        Attributes {
            verb,
            group,
            resource,
            subresource: sub,
            namespace: ns,
            name: "",
        }
    }

    #[test]
    fn the_role_decides() {
        let rbac = Rbac::from_yaml(ROLE).expect("role");
        assert_eq!(rbac.user, "system:serviceaccount:agents:agentry");
        assert!(rbac.allows(&attrs("create", "batch", "jobs", "", "agents")));
        assert!(rbac.allows(&attrs("get", "", "pods", "log", "agents")));
        assert!(!rbac.allows(&attrs("delete", "batch", "jobs", "", "agents")));
        assert!(!rbac.allows(&attrs("create", "batch", "jobs", "", "default")));
        assert!(!rbac.allows(&attrs("create", "", "secrets", "", "agents")));
        assert_eq!(
            rbac.forbidden_message(&attrs("create", "batch", "jobs", "", "agents")),
            "jobs.batch is forbidden: User \"system:serviceaccount:agents:agentry\" cannot create resource \"jobs\" in API group \"batch\" in the namespace \"agents\""
        );
        assert!(Rbac::from_yaml("kind: Role\n").is_err());
    }
}
