"""The papers' figures, measured: `fairsim-vtc-tables`, `fairsim-fairserve-table`,
`fairsim-policy-table` and the validation report `fairsim-validation`."""
