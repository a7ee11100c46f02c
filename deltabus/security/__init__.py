"""Who may do what: `principal` (the user a request comes from, Kafka's KafkaPrincipal),
`acls` (Kafka's ACL bindings, their codes, and the authorizer), `scram` (SCRAM credentials as
Kafka stores and checks them). Pure: no I/O; the doors and the controller use them."""
